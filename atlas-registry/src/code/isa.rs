//! PTX ISA versions and the CUDA drivers that JIT-compile them: PTX carries the ISA version of the
//! toolkit that wrote it (`.version 9.0` from CUDA 13.0), and a driver JIT-compiles PTX of the ISA
//! versions of its own CUDA release and older ones only; newer PTX fails at load with
//! `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, the loading error users meet most. Knowing the first
//! release of each ISA version, Atlas says so before the JIT does, naming both versions.
//!
//! Atlas never refuses what the driver would load: an ISA version the table does not list is
//! refused only when even the newest one below it needs a newer driver (ISA versions grow with
//! every release, so a later one never needs an older driver), and otherwise left to the driver.

/// A version, of the PTX ISA or of a CUDA release: `(major, minor)`.
type Version = (u32, u32);

/// `(PTX ISA version, first CUDA release whose driver JIT-compiles it)`, oldest first: the PTX
/// ISA's release history (PTX ISA document, "Release Notes"; the same table as NVIDIA's
/// `cuda.bindings.utils.get_minimal_required_cuda_ver_from_ptx_ver`). Releases without an ISA
/// version of their own (CUDA 12.6 writes 8.5) are not listed.
const RELEASES: &[(Version, Version)] = &[
    ((1, 0), (1, 0)),
    ((1, 1), (1, 1)),
    ((1, 2), (2, 0)),
    ((1, 3), (2, 1)),
    ((1, 4), (2, 2)),
    ((2, 0), (3, 0)),
    ((2, 1), (3, 1)),
    ((2, 2), (3, 2)),
    ((2, 3), (4, 0)),
    ((3, 0), (4, 1)),
    ((3, 1), (5, 0)),
    ((3, 2), (5, 5)),
    ((4, 0), (6, 0)),
    ((4, 1), (6, 5)),
    ((4, 2), (7, 0)),
    ((4, 3), (7, 5)),
    ((5, 0), (8, 0)),
    ((6, 0), (9, 0)),
    ((6, 1), (9, 1)),
    ((6, 2), (9, 2)),
    ((6, 3), (10, 0)),
    ((6, 4), (10, 1)),
    ((6, 5), (10, 2)),
    ((7, 0), (11, 0)),
    ((7, 1), (11, 1)),
    ((7, 2), (11, 2)),
    ((7, 3), (11, 3)),
    ((7, 4), (11, 4)),
    ((7, 5), (11, 5)),
    ((7, 6), (11, 6)),
    ((7, 7), (11, 7)),
    ((7, 8), (11, 8)),
    ((8, 0), (12, 0)),
    ((8, 1), (12, 1)),
    ((8, 2), (12, 2)),
    ((8, 3), (12, 3)),
    ((8, 4), (12, 4)),
    ((8, 5), (12, 5)),
    ((8, 6), (12, 7)),
    ((8, 7), (12, 8)),
    ((8, 8), (12, 9)),
    ((9, 0), (13, 0)),
    ((9, 1), (13, 1)),
];

/// Whether a driver JIT-compiles PTX of some ISA version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It does: the table lists the version, and the driver is of its release or newer.
    Takes,
    /// It does not: the version needs a driver of this CUDA release or newer (for a version the
    /// table does not list, at least that of the newest one below it).
    Refuses {
        /// The CUDA release.
        needs: Version,
    },
    /// Only the driver can tell: a version the table does not list, which the driver is new enough
    /// for as far as the table knows.
    DriverJudges,
}

/// Whether a driver of CUDA release `driver` JIT-compiles PTX of ISA version `isa`.
pub(crate) fn verdict(isa: Version, driver: Version) -> Verdict {
    match RELEASES.iter().rev().find(|(listed, _)| *listed <= isa) {
        Some(&(_, needs)) if driver < needs => Verdict::Refuses { needs },
        Some(&(listed, _)) if listed == isa => Verdict::Takes,
        _ => Verdict::DriverJudges,
    }
}

/// The newest ISA version a driver of CUDA release `driver` JIT-compiles, as far as the table
/// knows; `None` for a driver older than every release it lists.
pub(crate) fn newest_for(driver: Version) -> Option<Version> {
    RELEASES
        .iter()
        .rev()
        .find(|(_, needs)| *needs <= driver)
        .map(|&(isa, _)| isa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_grows_in_both_columns() {
        for pair in RELEASES.windows(2) {
            let [(isa_a, cuda_a), (isa_b, cuda_b)] = pair else {
                unreachable!()
            };
            assert!(isa_a < isa_b && cuda_a < cuda_b, "{pair:?}");
        }
    }

    #[test]
    fn each_isa_needs_its_release() {
        use Verdict::*;
        for (isa, driver, want) in [
            ((9, 0), (12, 4), Refuses { needs: (13, 0) }),
            ((9, 0), (13, 0), Takes),
            ((9, 0), (13, 2), Takes),
            ((8, 4), (12, 4), Takes),
            ((8, 5), (12, 4), Refuses { needs: (12, 5) }),
            ((8, 5), (12, 6), Takes),
            ((8, 6), (12, 6), Refuses { needs: (12, 7) }),
            ((8, 7), (12, 8), Takes),
            ((8, 8), (12, 8), Refuses { needs: (12, 9) }),
            ((8, 0), (11, 8), Refuses { needs: (12, 0) }),
            ((7, 8), (11, 8), Takes),
            ((7, 0), (10, 2), Refuses { needs: (11, 0) }),
            ((6, 5), (10, 1), Refuses { needs: (10, 2) }),
            ((6, 0), (9, 0), Takes),
            ((5, 0), (8, 0), Takes),
            ((1, 0), (1, 0), Takes),
            // Past the table: at least what 9.1 needs, else the driver's to judge.
            ((9, 9), (13, 0), Refuses { needs: (13, 1) }),
            ((9, 9), (13, 1), DriverJudges),
            ((9, 2), (14, 0), DriverJudges),
            // Between listed versions: as the one below, and the driver judges.
            ((8, 9), (12, 8), Refuses { needs: (12, 9) }),
            ((8, 9), (12, 9), DriverJudges),
            // Before the first.
            ((0, 9), (1, 0), DriverJudges),
        ] {
            assert_eq!(
                verdict(isa, driver),
                want,
                "PTX ISA {isa:?} on CUDA {driver:?}"
            );
        }
    }

    #[test]
    fn the_newest_isa_of_a_driver() {
        for (driver, isa) in [
            ((12, 4), Some((8, 4))),
            ((12, 6), Some((8, 5))),
            ((12, 7), Some((8, 6))),
            ((13, 0), Some((9, 0))),
            ((14, 2), Some((9, 1))),
            ((11, 8), Some((7, 8))),
            ((0, 9), None),
        ] {
            assert_eq!(newest_for(driver), isa, "CUDA {driver:?}");
        }
    }
}
