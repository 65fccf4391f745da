//! The committed fixtures under `tests/fixtures/`: small real fatbins, as nvcc 13.0 and NVIDIA's
//! libraries write them (`tests/fixtures/make.sh` makes them; `tests/fixtures/MADE` lists the
//! commands and the nvcc version).

/// One fixture.
pub struct Fixture {
    /// Its file name under `tests/fixtures/`.
    pub name: &'static str,
    pub bytes: &'static [u8],
    /// What is in it that a first version of Atlas's checks refused (empty: nothing).
    pub refused_for: &'static str,
}

macro_rules! fixture {
    ($name:literal, $refused_for:literal) => {
        Fixture {
            name: $name,
            bytes: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/",
                $name
            )),
            refused_for: $refused_for,
        }
    };
}

/// Every fixture: first those a first version of Atlas's checks refused, then the sm_90 fatbins
/// of the project's kernels (every entry compressed: zstd and LZ4) that the fuzzers start from.
pub const FIXTURES: &[Fixture] = &[
    fixture!(
        "elementwise.sm_90a.zstd.fatbin",
        "sm_90a: flags 0x100000 on its entries"
    ),
    fixture!(
        "block_reduce.families.zstd.fatbin",
        "sm_100f and sm_120f beside sm_90: flags 0x200000 on the Blackwell entries"
    ),
    fixture!(
        "block_reduce.families.lz4.fatbin",
        "sm_100f and sm_120f beside sm_90, LZ4: flags 0x200000 on the Blackwell entries"
    ),
    fixture!(
        "cudart.sm_90.fatbin",
        "the CUDA runtime's cubin in an nvcc 13 -shared library: e_flags 0x05005a04"
    ),
    fixture!(
        "cufft10.lz4.fatbin",
        "cuFFT 10.9 (CUDA 11): a PTX entry whose options record is offset 0, size 0"
    ),
    fixture!("elementwise.sm_90.zstd.fatbin", ""),
    fixture!("elementwise.sm_90.lz4.fatbin", ""),
    fixture!("device_global.sm_90.zstd.fatbin", ""),
    fixture!("device_global.sm_90.lz4.fatbin", ""),
    fixture!("cooperative.sm_90.zstd.fatbin", ""),
    fixture!("cooperative.sm_90.lz4.fatbin", ""),
    fixture!("cluster.sm_90.zstd.fatbin", ""),
    fixture!("cluster.sm_90.lz4.fatbin", ""),
    fixture!("noop.sm_90.zstd.fatbin", ""),
    fixture!("noop.sm_90.lz4.fatbin", ""),
    fixture!("block_reduce.sm_90.zstd.fatbin", ""),
    fixture!("block_reduce.sm_90.lz4.fatbin", ""),
];

/// A mutant of the compressed fuzz (`compressed_fuzz.rs`) that Atlas passed and that crashed the
/// driver (SIGSEGV inside `cuModuleLoadData`; an H200, driver 580), committed under
/// `tests/fixtures/crashes/` beside the real fatbin it was made from (`make.sh` there cuts those
/// out of NVIDIA's libraries).
pub struct Crash {
    /// The fuzz seed that made it.
    pub seed: u64,
    /// The source as the GPU run named it (its place among the run's sources, the library, the
    /// fatbin's index in the library's `.nv_fatbin` section, its file offset and size).
    pub source_name: &'static str,
    /// The source fatbin, cut from the library.
    pub source: &'static [u8],
    /// The mutant fatbin: the source's sm_90 entry alone, its cubin mutated and compressed again.
    pub mutant: &'static [u8],
    /// What the fuzz said it changed, after the source's name.
    pub what: &'static str,
    /// The mutant's changes to the cubin, grouped: what each group is, the offsets of its bytes
    /// in the cubin, and, for the fault that Atlas refuses the mutant for (a structure the driver
    /// follows), words of the refusal; the other groups change what the driver does not follow,
    /// or only meaning, and pass.
    pub faults: &'static [(&'static str, &'static [usize], Option<&'static str>)],
}

macro_rules! crash_file {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/crashes/",
            $name
        ))
    };
}

/// The mutants of the 10,000-mutant GPU runs of seeds 0..10000 (2426, 5270, 9481) and
/// 30000..40000 (33202, 39125, 39170) that crashed the driver, all of them. The sources of the
/// later three are other fatbins of cuBLASLt's `.nv_fatbin` section with the same bytes as that
/// of 2426 (the library holds many copies of it).
pub const CRASHES: &[Crash] = &[
    Crash {
        seed: 2426,
        source_name: "025-libcublasLt.so.13.1.0.3__.nv_fatbin_fatbin_1323_at_0x110273f8__3216_\
                      bytes_.fatbin",
        source: crash_file!("cublasLt-13.1.0.3.fatbin-1323.fatbin"),
        mutant: crash_file!("seed2426.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): 5 random byte(s) changed at 1774, 51, 4652, \
               1770, 4671",
        faults: &[
            (
                "the tool name and tool version offsets of .note.nv.tkinfo (0x840001, 0xed0007)",
                &[1770, 1774],
                Some("tool name offset"),
            ),
            ("the top byte of e_flags (0x06 -> 0x1c)", &[51], None),
            (".nv.callgraph's sh_type and sh_addr", &[4652, 4671], None),
        ],
    },
    Crash {
        seed: 5270,
        source_name: "030-libcusolver.so.12.0.4.66__.nv_fatbin_fatbin_82_at_0x1a0de38__6208_\
                      bytes_.fatbin",
        source: crash_file!("cusolver-12.0.4.66.fatbin-82.fatbin"),
        mutant: crash_file!("seed5270.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): .nv.info record attribute at 789: 0x5f -> 0x5d",
        faults: &[(
            ".nv.info's one record (half word 0x0101) made SYSCALLS_FALLBACK (0x5d), whose value \
             is pairs of symbol indexes",
            &[789],
            Some("(attribute 0x5d)"),
        )],
    },
    Crash {
        seed: 9481,
        source_name: "031-libcusparse.so.12.6.3.3__.nv_fatbin_fatbin_18_at_0x2797450__5416_\
                      bytes_.fatbin",
        source: crash_file!("cusparse-12.6.3.3.fatbin-18.fatbin"),
        mutant: crash_file!("seed9481.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): 4 random byte(s) changed at 1199, 627, 1265, 1619",
        faults: &[
            (
                "the tool name offset of .note.nv.tkinfo (0x96000001)",
                &[627],
                Some("tool name offset"),
            ),
            (
                "sh_flags of .note.nv.tkinfo, sh_addr of .note.nv.cuinfo, p_align of the first \
                 program header",
                &[1199, 1265, 1619],
                None,
            ),
        ],
    },
    Crash {
        seed: 33202,
        source_name: "009-libcublasLt.so.13.1.0.3__.nv_fatbin_fatbin_1230_at_0x10fb2e70__3216_\
                      bytes_.fatbin",
        source: crash_file!("cublasLt-13.1.0.3.fatbin-1323.fatbin"),
        mutant: crash_file!("seed33202.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): e_flags at 48: 0x6005a04 -> 0x6005a0b",
        faults: &[(
            "the flag byte of e_flags (ABI version 8: 0x04 -> 0x0b), bit 0 set",
            &[48],
            Some("sets bit 0"),
        )],
    },
    Crash {
        seed: 39125,
        source_name: "022-libcublasLt.so.13.1.0.3__.nv_fatbin_fatbin_1020_at_0x10e29258__3216_\
                      bytes_.fatbin",
        source: crash_file!("cublasLt-13.1.0.3.fatbin-1323.fatbin"),
        mutant: crash_file!("seed39125.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): .nv.info record attribute at 2025: 0x17 -> 0x3",
        faults: &[(
            "a KPARAM_INFO record (0x17) relabelled JUMPTABLE_RELOCS (0x03)",
            &[2025],
            Some("JUMPTABLE_RELOCS"),
        )],
    },
    Crash {
        seed: 39170,
        source_name: "010-libcublasLt.so.13.1.0.3__.nv_fatbin_fatbin_1343_at_0x11036f38__3216_\
                      bytes_.fatbin",
        source: crash_file!("cublasLt-13.1.0.3.fatbin-1323.fatbin"),
        mutant: crash_file!("seed39170.fatbin"),
        what: "ELF sm_90 zstd, entry 0 (Zstd): e_flags at 48: 0x6005a04 -> 0x6005a13",
        faults: &[(
            "the flag byte of e_flags (ABI version 8: 0x04 -> 0x13), bit 0 set",
            &[48],
            Some("sets bit 0"),
        )],
    },
];
