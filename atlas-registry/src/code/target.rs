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
//! Code built for a feature set beyond the baseline ([`Features`]) runs on fewer devices, SASS and
//! PTX alike: "a" code (`sm_90a`, `compute_100a`) on its own compute capability only, "f" code
//! (`sm_100f`, `compute_120f`) on the devices of its family, those of its major version and the
//! same or a newer minor one ("Code compiled with an architecture-specific compiler target can
//! only be run on the exact compute capability it was compiled for"; "Code compiled for a
//! family-specific target can only be run on GPUs which are members of that family": CUDA
//! Programming Guide, "Feature Availability", whose Table 28 lists `compute_100f` for 10.0, 10.3
//! and 10.7, `compute_103f` for 10.3 and 10.7, `compute_110f` for 11.0, `compute_120f` for 12.0
//! and 12.1, `compute_121f` for 12.1). The driver refuses such code elsewhere, so it is neither
//! checked nor chosen for another device: not even PTX, which it does not JIT-compile for one.
//!
//! What the driver loads of a fatbin is settled, so that a load can hand it that code alone
//! ([`fatbin::sole_sass`](crate::code::blob::fatbin::sole_sass)), when the fatbin holds SASS of
//! exactly the device's SM in one entry and no other SASS the device may load: the driver takes
//! SASS built for the device over anything else, unless an environment variable makes it JIT
//! the PTX ([`jit_forced`]).
//!
//! Which SASS a device surely runs, for choosing among blobs, is narrower on NVIDIA's Tegra SoCs:
//! "binary compatibility is supported only for the desktop. It is not supported for Tegra" (CUDA
//! C++ Programming Guide, "Binary Compatibility"), so an Orin (8.7) runs sm_87 SASS only. The
//! families agree: Thor (11.0), the one Tegra part of CUDA 13's families, is a family of its own.

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

/// The feature set code is built for, named by the suffix of its architecture (CUDA Programming
/// Guide, "Feature Set Compiler Targets"), which says on which devices it runs. Ordered from the
/// fewest features to the most: of code for one SM, the later is built more for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Features {
    /// No suffix (`sm_90`, `compute_90`): SASS runs on its major version's devices of the same or
    /// a newer minor one, PTX on every device at least as new.
    Baseline,
    /// `f` (`sm_100f`, `compute_100f`; from CUDA 12.9 and compute capability 10.0): SASS and PTX
    /// run on the devices of its family, its major version's of the same or a newer minor one.
    Family,
    /// `a` (`sm_90a`, `compute_90a`; from compute capability 9.0): SASS and PTX run on devices of
    /// exactly its compute capability.
    Specific,
}

impl Features {
    /// The suffix that names it: `""`, `"f"`, `"a"`.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Self::Baseline => "",
            Self::Family => "f",
            Self::Specific => "a",
        }
    }
}

/// An architecture code is built for: an SM number (`10 * major + minor`) and a feature set
/// (`sm_100a`: 100 and [`Features::Specific`]). Ordered by SM number, then feature set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Arch {
    /// The SM number.
    pub(crate) sm: u32,
    /// The feature set.
    pub(crate) features: Features,
}

impl Arch {
    /// SM `sm` of the baseline feature set.
    #[cfg(test)]
    pub(crate) const fn baseline(sm: u32) -> Self {
        Self {
            sm,
            features: Features::Baseline,
        }
    }
}

/// `100a`: the SM number and the suffix, to follow `sm_` or `compute_`.
impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.sm, self.features.suffix())
    }
}

/// Code in a blob, by what it is and the architecture it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// SASS (a cubin) for this architecture (`sm_90a`).
    Sass(Arch),
    /// PTX for this virtual architecture (`compute_90a`).
    Ptx(Arch),
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

    /// Whether the driver may load `code` for one of these devices: code built for exactly the
    /// device's compute capability; "f" code and SASS of an older minor version of its major
    /// one; plain PTX of any older architecture. "a" code never runs on another device.
    pub(crate) fn may_load(self, code: Code) -> bool {
        let (Code::Sass(arch) | Code::Ptx(arch)) = code;
        match self {
            Self::Every => match code {
                Code::Sass(_) => SM_NUMBERS.contains(&arch.sm),
                Code::Ptx(_) => arch.sm <= *SM_NUMBERS.end(),
            },
            Self::Sm(device) => {
                let in_family = arch.sm / 10 == device / 10 && arch.sm <= device;
                match (code, arch.features) {
                    (_, Features::Specific) => arch.sm == device,
                    (Code::Sass(_), _) | (Code::Ptx(_), Features::Family) => in_family,
                    (Code::Ptx(_), Features::Baseline) => arch.sm <= device,
                }
            }
        }
    }
}

impl Devices {
    /// Whether these devices surely run SASS for `arch`, not only may load it: their own, or on a
    /// desktop GPU, SASS of an older minor version of their architecture (plain or "f"); `false`
    /// for [`Devices::Every`].
    pub(crate) fn runs_sass(self, arch: Arch) -> bool {
        match self {
            Self::Every => false,
            Self::Sm(device) => {
                arch.sm == device || (self.may_load(Code::Sass(arch)) && !TEGRA.contains(&device))
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

    /// `"100a"` as an [`Arch`].
    fn arch(name: &str) -> Arch {
        let digits = name.bytes().take_while(u8::is_ascii_digit).count();
        let features = match &name[digits..] {
            "" => Features::Baseline,
            "f" => Features::Family,
            "a" => Features::Specific,
            other => panic!("suffix {other}"),
        };
        Arch {
            sm: name[..digits].parse().unwrap(),
            features,
        }
    }

    fn sass(sm: u32) -> Code {
        Code::Sass(Arch::baseline(sm))
    }

    fn ptx(sm: u32) -> Code {
        Code::Ptx(Arch::baseline(sm))
    }

    #[test]
    fn sass_runs_within_its_major_version_ptx_on_anything_newer() {
        let sm90 = Devices::of((9, 0)).unwrap();
        assert_eq!(sm90, Devices::Sm(90));
        assert!(sm90.may_load(sass(90)));
        for other in [80, 86, 89, 100, 120, 91] {
            assert!(!sm90.may_load(sass(other)), "sm_{other}");
        }
        let sm89 = Devices::Sm(89);
        for sm in [80, 86, 87, 89] {
            assert!(sm89.may_load(sass(sm)), "sm_{sm}");
        }
        assert!(!sm89.may_load(sass(75)) && !sm89.may_load(sass(90)));
        for sm in [0, 52, 75, 90] {
            assert!(sm90.may_load(ptx(sm)), "compute_{sm}");
        }
        assert!(!sm90.may_load(ptx(100)) && !sm90.may_load(ptx(91)));
        assert!(Devices::Sm(121).may_load(sass(120)));
        assert!(!Devices::Sm(120).may_load(sass(121)));
    }

    #[test]
    fn desktop_gpus_surely_run_older_minors_sass_tegra_only_their_own() {
        let (a10, orin, l4) = (Devices::Sm(86), Devices::Sm(87), Devices::Sm(89));
        assert!(
            a10.runs_sass(arch("86")) && a10.runs_sass(arch("80")) && !a10.runs_sass(arch("89"))
        );
        assert!(l4.runs_sass(arch("86")) && l4.runs_sass(arch("80")));
        assert!(
            orin.runs_sass(arch("87"))
                && !orin.runs_sass(arch("86"))
                && !orin.runs_sass(arch("80"))
        );
        assert!(orin.may_load(sass(86)), "the driver's choice is its own");
        assert!(
            Devices::Sm(110).runs_sass(arch("110")) && !Devices::Sm(110).runs_sass(arch("100"))
        );
        assert!(!Devices::Every.runs_sass(arch("90")));
    }

    #[test]
    fn every_device_is_every_plausible_sm() {
        for sm in [20, 90, 121, 129] {
            assert!(Devices::Every.may_load(sass(sm)), "sm_{sm}");
        }
        for sm in [0, 19, 130, 144, 190, 255, u32::MAX] {
            assert!(!Devices::Every.may_load(sass(sm)), "sm_{sm}");
        }
        assert!(Devices::Every.may_load(ptx(120)));
        assert!(!Devices::Every.may_load(ptx(255)));
        assert_eq!(Devices::of((u32::MAX, 0)), None);
        assert_eq!(Devices::of((9, 10)), None);
    }

    /// The documented compatibility of "a" and "f" code (CUDA Programming Guide, Table 28), SASS
    /// and PTX alike, on the compute capabilities of CUDA 13, against plain code's.
    #[test]
    fn a_code_runs_on_its_compute_capability_f_code_within_its_family() {
        const DEVICES: [u32; 9] = [90, 100, 103, 110, 120, 121, 89, 87, 80];
        for (name, sass_on, ptx_on) in [
            ("90a", &[90][..], &[90][..]),
            ("100a", &[100], &[100]),
            ("103a", &[103], &[103]),
            ("120a", &[120], &[120]),
            ("121a", &[121], &[121]),
            ("100f", &[100, 103], &[100, 103]),
            ("103f", &[103], &[103]),
            ("110f", &[110], &[110]),
            ("120f", &[120, 121], &[120, 121]),
            ("121f", &[121], &[121]),
            ("100", &[100, 103], &[100, 103, 110, 120, 121]),
            ("90", &[90], &[90, 100, 103, 110, 120, 121]),
        ] {
            let arch = arch(name);
            for device in DEVICES {
                let device_sm = Devices::Sm(device);
                let sass = device_sm.may_load(Code::Sass(arch));
                let ptx = device_sm.may_load(Code::Ptx(arch));
                assert_eq!(sass, sass_on.contains(&device), "sm_{name} on {device}");
                assert_eq!(ptx, ptx_on.contains(&device), "compute_{name} on {device}");
                assert_eq!(
                    device_sm.runs_sass(arch),
                    sass,
                    "sm_{name} runs on {device}"
                );
            }
            assert!(Devices::Every.may_load(Code::Sass(arch)), "sm_{name}");
            assert!(Devices::Every.may_load(Code::Ptx(arch)), "compute_{name}");
        }
        assert_eq!(arch("100a").to_string(), "100a");
        assert!(arch("100") < arch("100f") && arch("100f") < arch("100a"));
        assert!(arch("100a") < arch("103"));
    }
}
