//! Which code a device can run: the SM numbers Atlas takes as real, and which entries of a fatbin
//! the driver may pick for a device of a given compute capability. Blob validation (which entries
//! it checks) and parameter layouts (which entries they are read from) both ask here.
//!
//! The rule is a superset of what the driver picks, so that everything it may load is covered:
//! SASS (a cubin) runs on devices of its major version and the same or a newer minor one (sm_80
//! SASS on 8.0, 8.6 and 8.9); PTX is compiled by the driver for any device at least as new as its
//! target. The driver prefers the best SASS and compiles PTX only when there is none, or always
//! under `CUDA_FORCE_PTX_JIT=1`: both are inside the rule.
//!
//! What the driver loads of a fatbin is settled, so that a load can hand it that code alone
//! ([`fatbin::sole_sass`](crate::code::blob::fatbin::sole_sass)), when the fatbin holds SASS of
//! exactly the device's SM in one entry and no other SASS the device may load: the driver takes
//! SASS built for the device over anything else, unless an environment variable makes it JIT
//! the PTX ([`jit_forced`]).
//!
//! Which SASS a device surely runs, for choosing among blobs, is narrower on NVIDIA's Tegra SoCs:
//! "binary compatibility is supported only for the desktop. It is not supported for Tegra" (CUDA
//! C++ Programming Guide, "Binary Compatibility"), so an Orin (8.7) runs sm_87 SASS only.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

/// The SM numbers (`10 * major + minor`) that code may be built for: sm_20 (the first with ELF
/// cubins) to the 12.x family (sm_120 and sm_121 are the newest CUDA 13 knows), with room for its
/// minor versions. A number outside is not an architecture of any device: the driver (an H200,
/// driver 580) crashed on cubins whose `e_flags` named SM 255, 144 or 190, which it indexes its
/// tables by. A newer family needs this range widened.
pub(crate) const SM_NUMBERS: RangeInclusive<u32> = 20..=129;

/// The SM numbers of the GPUs of NVIDIA's Tegra SoCs (Jetson, DRIVE): TK1, TX1, TX2, Xavier,
/// Orin, and Thor (sm_101 until CUDA 13 renamed it sm_110). They run SASS of their own compute
/// capability only.
const TEGRA: &[u32] = &[32, 53, 62, 72, 87, 101, 110];

/// Code in a blob, by what it is and the SM number it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// SASS (a cubin) for this SM.
    Sass(u32),
    /// PTX for this virtual architecture (`compute_90`: 90).
    Ptx(u32),
}

/// Which devices a check or a layout is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Devices {
    /// Every device whose SM number is in [`SM_NUMBERS`].
    Every,
    /// The devices of this SM number (`10 * major + minor`).
    Sm(u32),
}

impl Devices {
    /// The devices of compute capability `(major, minor)`; `None` when the numbers overflow.
    pub(crate) fn of((major, minor): (u32, u32)) -> Option<Self> {
        major
            .checked_mul(10)
            .and_then(|tens| tens.checked_add(minor))
            .filter(|_| minor < 10)
            .map(Self::Sm)
    }

    /// Whether the driver may load `code` for one of these devices.
    pub(crate) fn may_load(self, code: Code) -> bool {
        match self {
            Self::Every => match code {
                Code::Sass(sm) => SM_NUMBERS.contains(&sm),
                Code::Ptx(sm) => sm <= *SM_NUMBERS.end(),
            },
            Self::Sm(device) => match code {
                Code::Sass(sm) => sm / 10 == device / 10 && sm <= device,
                Code::Ptx(sm) => sm <= device,
            },
        }
    }
}

impl Devices {
    /// Whether these devices surely run SASS for `sm`, not only may load it: their own, or on a
    /// desktop GPU, SASS of an older minor version of their architecture; `false` for
    /// [`Devices::Every`].
    pub(crate) fn runs_sass(self, sm: u32) -> bool {
        match self {
            Self::Every => false,
            Self::Sm(device) => {
                sm == device || (self.may_load(Code::Sass(sm)) && !TEGRA.contains(&device))
            }
        }
    }
}

/// The environment variables that make the driver JIT-compile a fatbin's PTX although it holds
/// SASS for the device: `CUDA_FORCE_PTX_JIT` and `CUDA_FORCE_JIT` (which also covers LTO-IR).
const JIT_FORCING: [&str; 2] = ["CUDA_FORCE_PTX_JIT", "CUDA_FORCE_JIT"];

/// Whether the driver may JIT-compile PTX where the device has SASS of its own: one of
/// [`JIT_FORCING`] is set to anything but `0` or nothing. Read once per process, as the driver
/// reads its environment once, when it initialises.
pub(crate) fn jit_forced() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED.get_or_init(|| {
        JIT_FORCING.iter().any(|name| {
            std::env::var_os(name).is_some_and(|value| !value.is_empty() && value != "0")
        })
    })
}

impl std::fmt::Display for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Every => f.write_str("any device"),
            Self::Sm(sm) => write!(f, "sm_{sm}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sass_runs_within_its_major_version_ptx_on_anything_newer() {
        let sm90 = Devices::of((9, 0)).unwrap();
        assert_eq!(sm90, Devices::Sm(90));
        assert!(sm90.may_load(Code::Sass(90)));
        for other in [80, 86, 89, 100, 120, 91] {
            assert!(!sm90.may_load(Code::Sass(other)), "sm_{other}");
        }
        let sm89 = Devices::Sm(89);
        for sm in [80, 86, 87, 89] {
            assert!(sm89.may_load(Code::Sass(sm)), "sm_{sm}");
        }
        assert!(!sm89.may_load(Code::Sass(75)) && !sm89.may_load(Code::Sass(90)));
        for ptx in [0, 52, 75, 90] {
            assert!(sm90.may_load(Code::Ptx(ptx)), "compute_{ptx}");
        }
        assert!(!sm90.may_load(Code::Ptx(100)) && !sm90.may_load(Code::Ptx(91)));
        assert!(Devices::Sm(121).may_load(Code::Sass(120)));
        assert!(!Devices::Sm(120).may_load(Code::Sass(121)));
    }

    #[test]
    fn desktop_gpus_surely_run_older_minors_sass_tegra_only_their_own() {
        let (a10, orin, l4) = (Devices::Sm(86), Devices::Sm(87), Devices::Sm(89));
        assert!(a10.runs_sass(86) && a10.runs_sass(80) && !a10.runs_sass(89));
        assert!(l4.runs_sass(86) && l4.runs_sass(80));
        assert!(orin.runs_sass(87) && !orin.runs_sass(86) && !orin.runs_sass(80));
        assert!(
            orin.may_load(Code::Sass(86)),
            "the driver's choice is its own"
        );
        assert!(Devices::Sm(110).runs_sass(110) && !Devices::Sm(110).runs_sass(100));
        assert!(!Devices::Every.runs_sass(90));
    }

    #[test]
    fn every_device_is_every_plausible_sm() {
        for sm in [20, 90, 121, 129] {
            assert!(Devices::Every.may_load(Code::Sass(sm)), "sm_{sm}");
        }
        for sm in [0, 19, 130, 144, 190, 255, u32::MAX] {
            assert!(!Devices::Every.may_load(Code::Sass(sm)), "sm_{sm}");
        }
        assert!(Devices::Every.may_load(Code::Ptx(120)));
        assert!(!Devices::Every.may_load(Code::Ptx(255)));
        assert_eq!(Devices::of((u32::MAX, 0)), None);
        assert_eq!(Devices::of((9, 10)), None);
    }
}
