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
