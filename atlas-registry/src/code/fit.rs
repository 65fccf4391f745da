//! Whether a device runs a checked blob under its driver, and what of it: its own SASS, SASS of an
//! older minor version of its architecture, or PTX the driver JIT-compiles. Told before the driver
//! sees the blob, so that the two loading errors users meet most, PTX newer than the driver
//! (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) and code for other architectures only
//! (`CUDA_ERROR_NO_BINARY_FOR_GPU`), are refused naming the module, what it holds, the device and
//! the driver ([`Unfit`]); and blob sets load the best fit of their blobs ([`best`]).
//!
//! Atlas refuses only what the driver would refuse: which SASS and PTX a device may load is
//! [`target`](crate::code::target)'s rule, a superset of what the driver picks, and whether the
//! driver JIT-compiles PTX is [`isa`](crate::code::isa)'s table, which leaves ISA versions it does
//! not know to the driver. Of a fatbin, SASS the device runs wins over PTX (the driver takes it
//! too), and the fatbin is refused only when no entry the device may load remains. Code that
//! Atlas does not read for this (an AMD GPU code object, a clang offload bundle, bytes of an
//! unknown format, a fatbin entry of a kind Atlas does not know) is the driver's to judge.

use atlas_sys::CUresult;

use crate::code::blob::{BlobKind, code_targets, fatbin, ptx, sm_arch};
use crate::code::isa::{self, Verdict};
use crate::code::target::{Code, Devices};
use crate::device::host::CudaHost;
use crate::driver::calls;
use crate::error::AtlasError;

/// What of a blob a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runs {
    /// SASS for this SM: the device's own, or that of an older minor version of its architecture.
    Sass(u32),
    /// PTX that the driver JIT-compiles (or that only the driver can judge), for the virtual
    /// architecture `target` of ISA version `isa` (`None`: the text does not say).
    Ptx {
        /// The SM number of its `.target`.
        target: Option<u32>,
        /// Its `.version`.
        isa: Option<(u32, u32)>,
    },
    /// Code that Atlas does not read for this: the driver judges.
    Unread,
}

impl Runs {
    /// How good a choice it is, higher better: SASS over PTX (no JIT at load, code built for the
    /// device), SASS of a newer minor version and PTX of a newer architecture over older ones,
    /// code Atlas cannot judge last.
    fn rank(self) -> (u8, u32) {
        match self {
            Self::Sass(sm) => (2, sm),
            Self::Ptx { target, .. } => (1, target.unwrap_or(0)),
            Self::Unread => (0, 0),
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
    let Some(device) = Devices::of(cc) else {
        return Ok(Runs::Unread);
    };
    let no_code = || Unfit::NoCode {
        holds: code_targets(image),
    };
    match kind {
        BlobKind::Cubin => match sm_arch(image) {
            Some(sm) if device.may_load(Code::Sass(sm)) => Ok(Runs::Sass(sm)),
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
        BlobKind::Fatbin => fatbin_fit(image, device, driver).unwrap_or_else(|| Err(no_code())),
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
/// JIT-compiles, else (entries of unknown kinds) the driver's judgement, else the refusal of its
/// PTX; `None` when it holds nothing the device may load.
fn fatbin_fit(
    image: &[u8],
    device: Devices,
    driver: Option<(u32, u32)>,
) -> Option<Result<Runs, Unfit>> {
    let (mut sass, mut ptx, mut unknown) = (None, false, false);
    for code in fatbin::codes(image) {
        match code {
            None => unknown = true,
            Some(code) if !device.may_load(code) => {}
            Some(Code::Sass(sm)) => sass = sass.max(Some(sm)),
            Some(Code::Ptx(_)) => ptx = true,
        }
    }
    if let Some(sm) = sass {
        return Some(Ok(Runs::Sass(sm)));
    }
    let loadable_ptx = |code| matches!(code, Code::Ptx(_)) && device.may_load(code);
    let best_ptx = match fatbin::picked(image, loadable_ptx) {
        // Each entry's architecture is the one of its header, which the driver picks by.
        Ok(entries) => best(entries.into_iter().map(|(code, text)| {
            let target = match code {
                Code::Ptx(sm) | Code::Sass(sm) => sm,
            };
            let header = ptx::header(&text);
            (
                (),
                jit(
                    ptx::Header {
                        target: Some(target),
                        ..header
                    },
                    driver,
                ),
            )
        })),
        // Checked before (the code of every entry the device may pick): not reached.
        Err(_) => return Some(Ok(Runs::Unread)),
    };
    match best_ptx {
        Some((_, Ok(runs))) => Some(Ok(runs)),
        _ if unknown => Some(Ok(Runs::Unread)),
        Some((_, unfit)) => Some(unfit),
        None if ptx => Some(Ok(Runs::Unread)),
        None => None,
    }
}

/// The best of `fits`: the best-ranked code that runs (the first of equals); when none runs, PTX
/// that is too new over no code at all (it says what to build instead), the one that needs the
/// oldest driver first. `None` for no fits.
pub(crate) fn best<T>(
    fits: impl IntoIterator<Item = (T, Result<Runs, Unfit>)>,
) -> Option<(T, Result<Runs, Unfit>)> {
    let order = |fit: &Result<Runs, Unfit>| match fit {
        Ok(runs) => (2, runs.rank()),
        // The oldest release needed ranks highest.
        Err(Unfit::PtxTooNew { needs, .. }) => (
            1,
            (
                0,
                u32::MAX - needs.0.saturating_mul(100).saturating_add(needs.1),
            ),
        ),
        Err(Unfit::NoCode { .. }) => (0, (0, 0)),
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
