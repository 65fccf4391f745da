//! Kernel parameter layouts read from the blobs: the PTX and cubin readers against each other,
//! against layouts written by hand from `kernels/*.cu`, on odd and broken input, and (on a GPU)
//! against what the driver reports.
//!
//! `cargo test -p atlas-registry --test param_layout` needs no GPU. The test marked
//! `#[ignore = "needs an NVIDIA GPU"]` fails without one; run it on a GPU machine with
//! `cargo test -p atlas-registry --test param_layout -- --include-ignored`.

mod support;

use std::ops::Range;
use std::path::Path;

use atlas_kernels::{ELEMENTWISE_FATBIN, MODELS, cubin_for_model, ptx_for_model};
use atlas_registry::{
    AtlasRegistry, BlobKind, CubinProblem, KernelLayout, LayoutError, ParamSlot, PtxProblem,
    RecordIssue, UnreadableBlob, cubin_kernel_layouts, kernel_layout, kernel_layouts,
    ptx_kernel_layouts, validate_blob,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn layout(name: &str, params: &[(usize, usize)]) -> KernelLayout {
    KernelLayout {
        name: name.to_owned(),
        params: params
            .iter()
            .map(|&(offset, size)| ParamSlot { offset, size })
            .collect(),
        declared: Vec::new(),
    }
}

fn by_name(mut layouts: Vec<KernelLayout>) -> Vec<KernelLayout> {
    layouts.sort_by(|a, b| a.name.cmp(&b.name));
    layouts
}

/// The kernels of each source file, written by hand from `kernels/*.cu`: pointers take 8 bytes,
/// `float` and `unsigned int` 4, each parameter starting at the next multiple of its size.
/// Keyed by the stem of the blobs' file names in `kernels/gen/`; sorted by kernel name.
fn from_sources(stem: &str) -> Vec<KernelLayout> {
    match stem {
        // noop()
        "noop" => vec![layout("noop", &[])],
        // scale(float* x, float factor, unsigned n); axpy(const float* x, float* y, float a, unsigned n)
        "elementwise" => vec![
            layout("axpy", &[(0, 8), (8, 8), (16, 4), (20, 4)]),
            layout("scale", &[(0, 8), (8, 4), (12, 4)]),
        ],
        // block_sum(const float* in, float* out, unsigned n, unsigned chunk)
        "block_reduce" => vec![layout("block_sum", &[(0, 8), (8, 8), (16, 4), (20, 4)])],
        // add_bias(float* x, unsigned n)
        "device_global" => vec![layout("add_bias", &[(0, 8), (8, 4)])],
        // trap(); write_far(float* p)
        "faults" => vec![layout("trap", &[]), layout("write_far", &[(0, 8)])],
        // transform(const float* in, float* out, unsigned n)
        "model_a" | "model_b" => vec![layout("transform", &[(0, 8), (8, 8), (16, 4)])],
        // host_step(float* x, unsigned n, int* counter);
        // loop_step(float* x, unsigned n, unsigned long long handle, int* counter, int limit);
        // reset_counter(int* counter); set_condition(unsigned long long handle, const int* flag)
        "conditional" => vec![
            layout("host_step", &[(0, 8), (8, 4), (16, 8)]),
            layout("loop_step", &[(0, 8), (8, 4), (16, 8), (24, 8), (32, 4)]),
            layout("reset_counter", &[(0, 8)]),
            layout("set_condition", &[(0, 8), (8, 8)]),
        ],
        // pdl_step(float* x, unsigned n, float a, float b)
        "pdl" => vec![layout("pdl_step", &[(0, 8), (8, 4), (12, 4), (16, 4)])],
        // cluster_shape(unsigned* out); cluster_shape_pair(unsigned* out)
        "cluster" => vec![
            layout("cluster_shape", &[(0, 8)]),
            layout("cluster_shape_pair", &[(0, 8)]),
        ],
        // coop_sum(const unsigned* in, unsigned* partials, unsigned* out, unsigned n,
        //          unsigned* arrived)
        "cooperative" => vec![layout(
            "coop_sum",
            &[(0, 8), (8, 8), (16, 8), (24, 4), (32, 8)],
        )],
        // smid_items(unsigned* sm_of_item, unsigned items, unsigned hold_ns)
        "smid" => vec![layout("smid_items", &[(0, 8), (8, 4), (12, 4)])],
        // tma_tiles(const __grid_constant__ TensorMap map, float* out, unsigned box_rows,
        //           unsigned box_cols, unsigned swizzle), TensorMap 128 bytes aligned to 64: as the
        // sm_90 cubin lays it out (its parameters start at 0x210 of the constant bank, so the map
        // lies at 48); the PTX cannot say (`PtxProblem::TargetDependentOffset`).
        "tma" => vec![layout(
            "tma_tiles",
            &[(48, 128), (176, 8), (184, 4), (188, 4), (192, 4)],
        )],
        _ => panic!("no hand-written layouts for `{stem}`: add them from its .cu source"),
    }
}

/// The layouts of a PTX text of `kernels/gen/`, or `None` for one whose parameters are aligned
/// above 16 bytes (a tensor map), whose offsets depend on the architecture: checked to be refused
/// for that reason.
fn ptx_layouts(stem: &str, ptx: &[u8]) -> Option<Vec<KernelLayout>> {
    let read = ptx_kernel_layouts(ptx);
    if stem != "tma" {
        return Some(by_name(read.unwrap()));
    }
    match read {
        Err(LayoutError::Ptx {
            problem: PtxProblem::TargetDependentOffset { align: 64, .. },
            ..
        }) => None,
        other => panic!("{stem}: the tensor map's offset is not fixed by the PTX: {other:?}"),
    }
}

/// The file stem of a model's module in `kernels/gen/`.
fn stem<'a>(model: &'a str, module: &'a str) -> &'a str {
    if model == "demo" || model == "launch" || model == "hopper" {
        module
    } else {
        model
    }
}

fn gen_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/gen")
}

/// Where `needle` is in `haystack`; it must be there exactly once.
fn find_once(haystack: &[u8], needle: &[u8]) -> usize {
    let hits: Vec<usize> = haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "{needle:02x?} found {} times", hits.len());
    hits[0]
}

/// A little-endian integer of `N` bytes at `at` of `elf`.
fn le<const N: usize>(elf: &[u8], at: usize) -> usize {
    let mut bytes = [0u8; 8];
    bytes[..N].copy_from_slice(&elf[at..at + N]);
    u64::from_le_bytes(bytes) as usize
}

/// The index and the header's file offset of the section `name` of an ELF64 file, read by hand
/// (`object`'s reader needs the file aligned in memory, which a `Vec<u8>` need not be).
fn section_header(elf: &[u8], name: &str) -> (usize, usize) {
    let (shoff, shnum, shstrndx) = (le::<8>(elf, 0x28), le::<2>(elf, 0x3c), le::<2>(elf, 0x3e));
    let names = le::<8>(elf, shoff + shstrndx * 64 + 24);
    (0..shnum)
        .map(|i| (i, shoff + i * 64))
        .find(|&(_, header)| {
            let at = names + le::<4>(elf, header);
            elf[at..].split(|&c| c == 0).next() == Some(name.as_bytes())
        })
        .expect("the section exists")
}

/// The file range of the section `name` of an ELF file.
fn section_range(elf: &[u8], name: &str) -> Range<usize> {
    let (_, header) = section_header(elf, name);
    let (start, size) = (le::<8>(elf, header + 24), le::<8>(elf, header + 32));
    start..start + size
}

/// The file offset of the symbol `name`'s `st_other` byte.
fn st_other_offset(elf: &[u8], name: &str) -> usize {
    let symtab = section_range(elf, ".symtab");
    let (_, header) = section_header(elf, ".symtab");
    let strtab_index = le::<4>(elf, header + 40);
    let shoff = le::<8>(elf, 0x28);
    let strings = le::<8>(elf, shoff + strtab_index * 64 + 24);
    // Elf64_Sym: st_name u32, st_info u8, st_other u8, ...
    symtab
        .step_by(24)
        .find(|&symbol| {
            let at = strings + le::<4>(elf, symbol);
            elf[at..].split(|&c| c == 0).next() == Some(name.as_bytes())
        })
        .expect("the symbol exists")
        + 5
}

fn elementwise_cubin() -> Vec<u8> {
    cubin_for_model("demo", 90).unwrap()[1].1.to_vec()
}

/// The `EIATTR_KPARAM_INFO` record of `scale`'s third parameter (ordinal 2, offset 12) in the
/// elementwise cubin: format, attribute, length 12, index 0, ordinal 2, offset 12, size word.
const SCALE_PARAM_2: [u8; 16] = [
    0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0, 0x02, 0x00, 0x0c, 0x00, 0x00, 0xf0, 0x11, 0x00,
];

/// The cubin error for a mutated cubin, which must concern kernel `name`.
fn problem_of(name: &str, cubin: &[u8]) -> CubinProblem {
    match cubin_kernel_layouts(cubin) {
        Err(LayoutError::Cubin {
            kernel: Some(kernel),
            problem,
        }) if kernel == name => problem,
        other => panic!("expected an error about `{name}`, got {other:?}"),
    }
}

/// The cubin error for a mutated elementwise cubin, which must concern kernel `scale`.
fn scale_problem(cubin: &[u8]) -> CubinProblem {
    problem_of("scale", cubin)
}

/// Checks what every layout must be, whatever blob it came from.
fn assert_well_formed(layouts: &[KernelLayout]) {
    for kernel in layouts {
        let mut end = 0;
        for slot in &kernel.params {
            assert!(slot.size > 0, "{kernel:?}");
            assert!(slot.offset >= end, "{kernel:?}");
            end = slot.offset + slot.size;
        }
        assert_eq!(kernel.param_bytes(), end);
    }
}

// ---------------------------------------------------------------------------------------------
// The committed blobs
// ---------------------------------------------------------------------------------------------

#[test]
fn every_model_has_the_same_layouts_in_ptx_and_cubin_as_in_its_sources() {
    for model in MODELS {
        let ptx = ptx_for_model(model).unwrap();
        let cubin = cubin_for_model(model, 90).unwrap();
        assert_eq!(ptx.len(), cubin.len(), "{model}");
        for ((module, ptx), (cubin_module, cubin)) in ptx.iter().zip(cubin) {
            assert_eq!(module, cubin_module);
            let from_cubin = by_name(kernel_layouts(cubin).unwrap());
            let stem = stem(model, module);
            if let Some(from_ptx) = ptx_layouts(stem, ptx) {
                assert_eq!(from_ptx, from_cubin, "{model}/{module}: PTX vs cubin");
            }
            assert_eq!(
                from_cubin,
                from_sources(stem),
                "{model}/{module}: blob vs source"
            );
        }
    }
}

#[test]
fn every_file_in_kernels_gen_agrees_with_its_pair_and_its_source() {
    let mut pairs = 0;
    for entry in std::fs::read_dir(gen_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let bytes = std::fs::read(&path).unwrap();
        if let Some(stem) = name.strip_suffix(".sm_90.cubin") {
            let ptx = std::fs::read(gen_dir().join(format!("{stem}.ptx")))
                .unwrap_or_else(|e| panic!("{name} has no PTX beside it: {e}"));
            let from_cubin = by_name(cubin_kernel_layouts(&bytes).unwrap());
            if let Some(from_ptx) = ptx_layouts(stem, &ptx) {
                assert_eq!(from_ptx, from_cubin, "{stem}: PTX vs cubin");
            }
            assert_eq!(from_cubin, from_sources(stem), "{stem}: blob vs source");
            pairs += 1;
        } else if name.ends_with(".ptx") {
            let cubin = name.replace(".ptx", ".sm_90.cubin");
            if name == "conditional.ptx" {
                // NVRTC 12.0 makes no cubin of it; nvcc's sm_90 cubin may be there (a pair above).
                let from_ptx = by_name(ptx_kernel_layouts(&bytes).unwrap());
                assert_eq!(
                    from_ptx,
                    from_sources("conditional"),
                    "conditional: PTX vs source"
                );
                if !gen_dir().join(&cubin).exists() {
                    pairs += 1;
                }
                continue;
            }
            assert!(
                gen_dir().join(&cubin).exists(),
                "{name} has no cubin beside it"
            );
        } else if name.ends_with(".fatbin") {
            assert_eq!(
                kernel_layouts(&bytes),
                Err(LayoutError::NotReadable(UnreadableBlob::Fatbin))
            );
        }
    }
    assert_eq!(pairs, 13, "every module of kernels/regen.sh");
}

#[test]
fn one_kernel_is_looked_up_by_name() {
    for blob in [
        ptx_for_model("demo").unwrap()[1].1,
        cubin_for_model("demo", 90).unwrap()[1].1,
    ] {
        assert_eq!(
            kernel_layout(blob, "scale").unwrap(),
            Some(layout("scale", &[(0, 8), (8, 4), (12, 4)]))
        );
        assert_eq!(kernel_layout(blob, "scal").unwrap(), None);
        assert_eq!(kernel_layout(blob, "noop").unwrap(), None);
    }
    let layout = kernel_layout(cubin_for_model("demo", 90).unwrap()[1].1, "axpy")
        .unwrap()
        .unwrap();
    assert_eq!(layout.sizes().collect::<Vec<_>>(), [8, 8, 4, 4]);
    assert_eq!(layout.param_bytes(), 24);
}

#[test]
fn a_cubin_at_an_odd_address_reads_the_same() {
    let cubin = elementwise_cubin();
    let mut shifted = vec![0u8; cubin.len() + 1];
    shifted[1..].copy_from_slice(&cubin);
    assert_eq!(
        cubin_kernel_layouts(&shifted[1..]).unwrap(),
        cubin_kernel_layouts(&cubin).unwrap()
    );
}

#[test]
fn containers_and_foreign_code_are_not_readable_here() {
    let not = |blob: &[u8]| kernel_layouts(blob).unwrap_err();
    assert_eq!(
        not(ELEMENTWISE_FATBIN),
        LayoutError::NotReadable(UnreadableBlob::Fatbin)
    );
    assert_eq!(
        not(b"__CLANG_OFFLOAD_BUNDLE__\x02\0\0\0\0\0\0\0"),
        LayoutError::NotReadable(UnreadableBlob::OffloadBundle)
    );
    assert_eq!(
        not(&[0xff, 0xfe, 0x00, 0x80]),
        LayoutError::NotReadable(UnreadableBlob::Binary)
    );
    let mut amd = elementwise_cubin();
    amd[18..20].copy_from_slice(&224u16.to_le_bytes()); // e_machine = EM_AMDGPU
    let err = not(&amd);
    assert_eq!(
        err,
        LayoutError::NotReadable(UnreadableBlob::ForeignElf { machine: 224 })
    );
    assert!(err.to_string().contains("AMD GPU code object"), "{err}");
    assert!(
        not(ELEMENTWISE_FATBIN).to_string().contains("fatbin"),
        "the message names the format"
    );
}

// ---------------------------------------------------------------------------------------------
// PTX grammar
// ---------------------------------------------------------------------------------------------

const HEAD: &str = ".version 8.3\n.target sm_90\n.address_size 64\n";

fn ptx(body: &str) -> Vec<u8> {
    format!("{HEAD}{body}").into_bytes()
}

fn ptx_err(body: &str) -> (usize, Option<String>, PtxProblem) {
    match ptx_kernel_layouts(&ptx(body)) {
        Err(LayoutError::Ptx {
            line,
            kernel,
            problem,
        }) => (line, kernel, problem),
        other => panic!("expected a PTX error for {body:?}, got {other:?}"),
    }
}

/// Every scalar type, arrays, explicit alignment: the offsets written out by hand.
const EVERY_TYPE: &str = "
.visible .entry every_type(
    .param .b8 a0, .param .s8 a1, .param .u8 a2,
    .param .b16 a3, .param .s16 a4, .param .u16 a5, .param .f16 a6, .param .bf16 a7,
    .param .b32 a8, .param .s32 a9, .param .u32 a10, .param .f32 a11,
    .param .f16x2 a12, .param .bf16x2 a13,
    .param .b64 a14, .param .s64 a15, .param .u64 a16, .param .f64 a17,
    .param .b128 a18,
    .param .u8 a19,
    .param .u32 a20[3],
    .param .align 16 .b8 a21[5],
    .param .u16 a22[2][3]
)
{
    ret;
}
";

const EVERY_TYPE_SLOTS: &[(usize, usize)] = &[
    (0, 1),
    (1, 1),
    (2, 1),
    (4, 2),
    (6, 2),
    (8, 2),
    (10, 2),
    (12, 2),
    (16, 4),
    (20, 4),
    (24, 4),
    (28, 4),
    (32, 4),
    (36, 4),
    (40, 8),
    (48, 8),
    (56, 8),
    (64, 8),
    (80, 16),
    (96, 1),
    (100, 12),
    (112, 5),
    (118, 12),
];

/// By-value structs, `.ptr` attributes and padding after small parameters.
const STRUCTS_AND_POINTERS: &str = "
.visible .entry structs_and_pointers(
    .param .u8 flag,
    .param .align 8 .b8 by_value[24],
    .param .u64 .ptr .global .align 8 p,
    .param .u64 .ptr .align 16 q,
    .param .u64 .ptr.shared.align 4 r,
    .param .f32 f,
    .param .align 4 .b8 three[3],
    .param .f64 d
)
{
    ret;
}
";

const STRUCTS_AND_POINTERS_SLOTS: &[(usize, usize)] = &[
    (0, 1),
    (8, 24),
    (32, 8),
    (40, 8),
    (48, 8),
    (56, 4),
    (60, 3),
    (64, 8),
];

/// Every scalar parameter type and its size in bytes, from the PTX ISA.
const SCALAR_TYPES: &[(&str, usize)] = &[
    (".b8", 1),
    (".s8", 1),
    (".u8", 1),
    (".b16", 2),
    (".s16", 2),
    (".u16", 2),
    (".f16", 2),
    (".bf16", 2),
    (".b32", 4),
    (".s32", 4),
    (".u32", 4),
    (".f32", 4),
    (".f16x2", 4),
    (".bf16x2", 4),
    (".b64", 8),
    (".s64", 8),
    (".u64", 8),
    (".f64", 8),
    (".b128", 16),
];

/// A kernel `between(u8, TYPE, u8)`: the middle parameter shows the type's size and alignment.
fn between(ty: &str) -> String {
    format!(
        "{HEAD}.visible .entry between(.param .u8 a, .param {ty} b, .param .u8 c)\n{{\n    ret;\n}}\n"
    )
}

#[test]
fn ptx_params_of_every_type_are_laid_out_by_size_and_alignment() {
    assert_eq!(
        ptx_kernel_layouts(&ptx(EVERY_TYPE)).unwrap(),
        [layout("every_type", EVERY_TYPE_SLOTS)]
    );
    assert_eq!(
        ptx_kernel_layouts(&ptx(STRUCTS_AND_POINTERS)).unwrap(),
        [layout("structs_and_pointers", STRUCTS_AND_POINTERS_SLOTS)]
    );
}

#[test]
fn ptx_scalar_types_are_aligned_to_their_size() {
    for &(ty, size) in SCALAR_TYPES {
        assert_eq!(
            ptx_kernel_layouts(between(ty).as_bytes()).unwrap(),
            [layout("between", &[(0, 1), (size, size), (2 * size, 1)])],
            "{ty}"
        );
    }
}

#[test]
fn ptx_reader_skips_what_is_not_a_kernel_definition() {
    let body = r#"
// .entry in_a_line_comment(.param .u32 a) {
/* .entry in_a_block_comment(
   .param .u32 a) { } } } */
.file 1 "odd { name } .entry in_a_string.cu"
.global .align 4 .b8 table[8] = {0, 0, 0, 64, 0, 0, 128, 63};
.extern .shared .align 16 .b8 staged[];
.extern .func (.param .b32 ret) callee(.param .b64 p);
.extern .entry declared_elsewhere(.param .u32 a);
.func (.param .b32 ret) helper(.param .b64 p, .param .b32 q)
{
    .entry not_here;
    { { } }
    // } a brace in a comment
    /* { and
       another */
    ret;
}
.weak .entry weak_one(.param .u32 a, .param .u64 b) { ret; }
.entry no_parens
{
    ret;
}
.entry empty() { ret; }
.visible .entry tuned(.param .u32 a) .maxntid 256, 1, 1 .minnctapersm 2 { ret; }
.visible .entry _Z5scalePfj$x(.param .u32 n[0x4U], .param .u16 m[010])
{
    .pragma "nounroll { }";
    ret;
}
"#;
    assert_eq!(
        ptx_kernel_layouts(&ptx(body)).unwrap(),
        [
            layout("weak_one", &[(0, 4), (8, 8)]),
            layout("no_parens", &[]),
            layout("empty", &[]),
            layout("tuned", &[(0, 4)]),
            layout("_Z5scalePfj$x", &[(0, 16), (16, 16)]),
        ]
    );
}

#[test]
fn ptx_may_end_in_nuls_as_the_driver_takes_it() {
    let mut text = ptx(".entry k(.param .u32 a) { ret; }");
    text.extend_from_slice(b"\0\0");
    assert_eq!(kernel_layouts(&text).unwrap(), [layout("k", &[(0, 4)])]);
    text.push(b' ');
    assert_eq!(
        ptx_kernel_layouts(&text).unwrap_err(),
        LayoutError::Ptx {
            line: 4,
            kernel: None,
            problem: PtxProblem::NulByte {
                offset: text.len() - 3
            }
        }
    );
}

#[test]
fn ptx_syntax_the_reader_does_not_know_is_an_error_naming_line_and_kernel() {
    let k = Some("k".to_owned());
    // The first line of `body` is line 4.
    let cases: Vec<(&str, usize, Option<String>, PtxProblem)> = vec![
        (
            ".entry k(\n.param .pred p)\n{ ret; }",
            5,
            k.clone(),
            PtxProblem::UnknownType { ty: ".pred".into() },
        ),
        (
            ".entry k(.param .texref t) { ret; }",
            4,
            k.clone(),
            PtxProblem::UnknownType {
                ty: ".texref".into(),
            },
        ),
        (
            ".entry k(.reg .u32 r) { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`.reg`".into(),
                expected: "`.param`",
            },
        ),
        (
            ".entry k(.param .u32 a\n.param .u32 b) { ret; }",
            5,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`.param`".into(),
                expected: "`,` or `)`",
            },
        ),
        (
            ".entry k(.param .u32 a,) { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`)`".into(),
                expected: "`.param`",
            },
        ),
        (
            ".entry k(.param .f32 .ptr p) { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`.ptr`".into(),
                expected: "a parameter name, `.ptr` or the pointee's space or `.align`",
            },
        ),
        (
            ".entry k(.param .u32 .align 4 a) { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`.align`".into(),
                expected: "a parameter name, `.ptr` or the pointee's space or `.align`",
            },
        ),
        (
            ".entry k(.param .u32 a) junk { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`junk`".into(),
                expected: "the kernel's body `{`",
            },
        ),
        (
            ".entry (.param .u32 a) { ret; }",
            4,
            None,
            PtxProblem::Unexpected {
                found: "`(`".into(),
                expected: "a kernel name after `.entry`",
            },
        ),
        (
            ".entry k(.param .u32 a[0]) { ret; }",
            4,
            k.clone(),
            PtxProblem::EmptyArray { param: "a".into() },
        ),
        (
            ".entry k(.param .u32 a[12abc]) { ret; }",
            4,
            k.clone(),
            PtxProblem::BadNumber {
                text: "12abc".into(),
            },
        ),
        (
            ".entry k(.param .u32 a[4) { ret; }",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "`)`".into(),
                expected: "`]`",
            },
        ),
        (
            ".entry k(.param .align 3 .b8 a[3]) { ret; }",
            4,
            k.clone(),
            PtxProblem::BadAlignment { align: 3 },
        ),
        (
            ".entry k(.param .u8 a,\n.param .align 2 .u32 b) { ret; }",
            5,
            k.clone(),
            PtxProblem::AlignmentBelowType {
                param: "b".into(),
                align: 2,
                natural: 4,
            },
        ),
        (
            ".entry k(.param .u8 a,\n.param .align 64 .b8 map[128]) { ret; }",
            5,
            k.clone(),
            PtxProblem::TargetDependentOffset {
                param: "map".into(),
                align: 64,
            },
        ),
        (
            ".entry k(.param .u32 a[4294967296][4294967296]) { ret; }",
            4,
            k.clone(),
            PtxProblem::TooLarge,
        ),
        (
            ".entry k() { ret; }\n\n.entry k() { ret; }",
            6,
            k.clone(),
            PtxProblem::DuplicateKernel { name: "k".into() },
        ),
        (
            ".entry k()\n{\n ret;\n",
            5,
            k.clone(),
            PtxProblem::UnclosedBrace,
        ),
        (".entry k() { ret; }\n}", 5, None, PtxProblem::StrayBrace),
        (
            ".entry k() { .pragma \"a\\\nb\"; }\n}",
            6,
            None,
            PtxProblem::StrayBrace,
        ),
        (
            ".entry k() { ret; }\n/* never\nclosed",
            5,
            None,
            PtxProblem::UnterminatedComment,
        ),
        (
            ".entry k() { .pragma \"never closed; }",
            4,
            k.clone(),
            PtxProblem::UnterminatedString,
        ),
        (
            ".entry k(.param .u32",
            4,
            k.clone(),
            PtxProblem::Unexpected {
                found: "the end of the text".into(),
                expected: "a parameter name, `.ptr` or the pointee's space or `.align`",
            },
        ),
    ];
    for (body, line, kernel, problem) in cases {
        assert_eq!(ptx_err(body), (line, kernel, problem), "{body:?}");
    }
}

#[test]
fn ptx_without_version_or_not_utf8_is_an_error() {
    assert_eq!(
        ptx_kernel_layouts(b"// a comment\n.target sm_90\n.entry k() { ret; }").unwrap_err(),
        LayoutError::Ptx {
            line: 2,
            kernel: None,
            problem: PtxProblem::NoVersion
        }
    );
    let mut text = ptx("// caf\u{e9}\n");
    text.extend_from_slice(b"\n\xff .entry k() { ret; }");
    let offset = text.len() - 21; // the 0xff byte
    assert_eq!(
        ptx_kernel_layouts(&text).unwrap_err(),
        LayoutError::Ptx {
            line: 6,
            kernel: None,
            problem: PtxProblem::NotUtf8 { offset }
        }
    );
    assert_eq!(
        kernel_layouts(&text).unwrap_err(),
        LayoutError::NotReadable(UnreadableBlob::Binary)
    );
}

#[test]
fn ptx_errors_say_line_kernel_and_problem() {
    let err = ptx_kernel_layouts(&ptx(".entry k(\n.param .pred p)\n{ ret; }")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "PTX line 5 (kernel `k`): unknown parameter type `.pred`"
    );
}

// ---------------------------------------------------------------------------------------------
// Cubin records
// ---------------------------------------------------------------------------------------------

/// The elementwise cubin with `change` applied to the record of `scale`'s third parameter, and
/// that record's offset in `.nv.info.scale`.
fn with_scale_param_2(change: impl FnOnce(&mut [u8])) -> (Vec<u8>, usize) {
    let mut cubin = elementwise_cubin();
    let info = section_range(&cubin, ".nv.info.scale");
    let at = find_once(&cubin[info.clone()], &SCALE_PARAM_2);
    change(&mut cubin[info.start + at..info.start + at + 16]);
    (cubin, at)
}

/// The elementwise cubin with `change` applied to the 4 bytes of `scale`'s record that starts
/// with `head`, and that record's offset in `.nv.info.scale`.
fn with_scale_record(head: [u8; 4], change: impl FnOnce(&mut [u8])) -> (Vec<u8>, usize) {
    let mut cubin = elementwise_cubin();
    let info = section_range(&cubin, ".nv.info.scale");
    let at = find_once(&cubin[info.clone()], &head);
    change(&mut cubin[info.start + at..]);
    (cubin, at)
}

/// The file offset of the section header of `name` (ELF64: 64-byte headers from `e_shoff`).
fn section_header_offset(elf: &[u8], name: &str) -> usize {
    section_header(elf, name).1
}

fn record(at: usize, issue: RecordIssue) -> CubinProblem {
    CubinProblem::Record {
        section: ".nv.info.scale".into(),
        at,
        issue,
    }
}

#[test]
fn cubin_parameter_records_that_disagree_are_errors_not_layouts() {
    let (unchanged, _) = with_scale_param_2(|_| {});
    assert_eq!(
        by_name(cubin_kernel_layouts(&unchanged).unwrap()),
        from_sources("elementwise")
    );

    // Size 4 -> 8: the records end at 20, the total says 16.
    let (cubin, _) = with_scale_param_2(|r| r[14] = 0x21);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_CBANK_PARAM_SIZE",
            declared: 16,
            records_end: 20
        }
    );
    // Size 4 -> 0.
    let (cubin, _) = with_scale_param_2(|r| r[14] = 0x01);
    assert_eq!(scale_problem(&cubin), CubinProblem::ZeroSize { ordinal: 2 });
    // Ordinal 2 -> 1, and 2 -> 3.
    let (cubin, _) = with_scale_param_2(|r| r[8] = 1);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::DuplicateOrdinal { ordinal: 1 }
    );
    let (cubin, _) = with_scale_param_2(|r| r[8] = 3);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::MissingOrdinal { ordinal: 2 }
    );
    // Offset 12 -> 4: inside parameter 1 (8..12).
    let (cubin, _) = with_scale_param_2(|r| r[10] = 4);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::Overlap {
            ordinal: 2,
            offset: 4,
            previous_end: 12
        }
    );
}

#[test]
fn cubin_records_of_unknown_shape_or_kind_are_errors() {
    // Parameters in shared memory.
    let (cubin, at) = with_scale_param_2(|r| r[1] = 0x18);
    assert_eq!(
        scale_problem(&cubin),
        record(at, RecordIssue::Unsupported { attribute: 0x18 })
    );
    // A parameter record 8 bytes long.
    let (cubin, at) = with_scale_param_2(|r| r[2] = 8);
    assert_eq!(
        scale_problem(&cubin),
        record(
            at,
            RecordIssue::Shape {
                attribute: 0x17,
                format: 4,
                len: 8
            }
        )
    );
    // A parameter record in the 4-byte u16 format.
    let (cubin, at) = with_scale_param_2(|r| r[0] = 3);
    assert_eq!(
        scale_problem(&cubin),
        record(
            at,
            RecordIssue::Shape {
                attribute: 0x17,
                format: 3,
                len: 2
            }
        )
    );
    // A record format beyond the four known ones.
    let (cubin, at) = with_scale_param_2(|r| r[0] = 9);
    assert_eq!(
        scale_problem(&cubin),
        record(at, RecordIssue::UnknownFormat { format: 9 })
    );
    // A second total size record: EIATTR_MAXREG_COUNT (0x1b) turned into one.
    let (cubin, _) = with_scale_record([0x03, 0x1b, 0xff, 0x00], |r| r[1] = 0x19);
    let info = section_range(&cubin, ".nv.info.scale");
    let second = find_once(&cubin[info], &[0x03, 0x19, 0x10, 0x00]);
    assert_eq!(
        scale_problem(&cubin),
        record(second, RecordIssue::Duplicate { attribute: 0x19 })
    );
    // The last record cut short by the section's size.
    let mut cubin = elementwise_cubin();
    let header = section_header_offset(&cubin, ".nv.info.scale");
    let size = u64::from_le_bytes(cubin[header + 32..header + 40].try_into().unwrap());
    cubin[header + 32..header + 40].copy_from_slice(&(size - 2).to_le_bytes());
    // Where the last record starts depends on the compiler's record order; what must hold is that
    // the cut record is reported as truncated, at a record start inside the shortened section.
    match scale_problem(&cubin) {
        CubinProblem::Record {
            section,
            at,
            issue: RecordIssue::Truncated,
        } => {
            assert_eq!(section, ".nv.info.scale");
            assert!(at + 2 < size as usize && at % 4 == 0, "at {at} of {size}");
        }
        other => panic!("expected a truncated record, got {other:?}"),
    }
}

#[test]
fn cubin_totals_are_checked_against_the_parameter_records() {
    // EIATTR_CBANK_PARAM_SIZE 16 -> 20.
    let (cubin, _) = with_scale_record([0x03, 0x19, 0x10, 0x00], |r| r[2] = 0x14);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_CBANK_PARAM_SIZE",
            declared: 20,
            records_end: 16
        }
    );
    // EIATTR_PARAM_CBANK: u32 symbol, u16 offset, u16 size 16 -> 12.
    let (cubin, _) = with_scale_record([0x04, 0x0a, 0x08, 0x00], |r| r[10] = 12);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_PARAM_CBANK",
            declared: 12,
            records_end: 16
        }
    );
    // Every parameter record turned into padding (attribute 0x01): the totals still say 16.
    let mut cubin = elementwise_cubin();
    let info = section_range(&cubin, ".nv.info.scale");
    for at in info.clone().step_by(4) {
        if cubin[at..at + 4] == [0x04, 0x17, 0x0c, 0x00] {
            cubin[at + 1] = 0x01;
        }
    }
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_CBANK_PARAM_SIZE",
            declared: 16,
            records_end: 0
        }
    );
    // Parameter records with no total to check them against.
    let mut cubin = elementwise_cubin();
    for head in [[0x03, 0x19, 0x10, 0x00], [0x04, 0x0a, 0x08, 0x00]] {
        let at = info.start + find_once(&cubin[info.clone()], &head);
        cubin[at + 1] = 0x01;
    }
    assert_eq!(scale_problem(&cubin), CubinProblem::MissingTotal);
}

#[test]
fn cubin_structure_that_does_not_lead_to_the_records_is_an_error() {
    // A parameter record in the module-wide `.nv.info`: its first record made one.
    let mut cubin = elementwise_cubin();
    let module_info = section_range(&cubin, ".nv.info");
    cubin[module_info.start + 1] = 0x17;
    assert_eq!(
        cubin_kernel_layouts(&cubin).unwrap_err(),
        LayoutError::Cubin {
            kernel: None,
            problem: CubinProblem::Record {
                section: ".nv.info".into(),
                at: 0,
                issue: RecordIssue::Unsupported { attribute: 0x17 }
            }
        }
    );
    // The info section renamed.
    let mut cubin = elementwise_cubin();
    let names = section_range(&cubin, ".shstrtab");
    let at = names.start + find_once(&cubin[names], b".nv.info.scale\0");
    cubin[at + 13] = b'f';
    assert_eq!(scale_problem(&cubin), CubinProblem::MissingInfo);
    // The info section's type made SHT_NOBITS (8): it would read as no records at all.
    let mut cubin = elementwise_cubin();
    let header = section_header_offset(&cubin, ".nv.info.scale");
    cubin[header + 4..header + 8].copy_from_slice(&8u32.to_le_bytes());
    assert_eq!(scale_problem(&cubin), CubinProblem::InfoType { sh_type: 8 });
    // The info section linked to axpy's code.
    let mut cubin = elementwise_cubin();
    let scale = section_header_offset(&cubin, ".nv.info.scale");
    let axpy = section_header_offset(&cubin, ".nv.info.axpy");
    let code = u32::from_le_bytes(cubin[scale + 44..scale + 48].try_into().unwrap());
    let linked = u32::from_le_bytes(cubin[axpy + 44..axpy + 48].try_into().unwrap());
    cubin.copy_within(axpy + 44..axpy + 48, scale + 44);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::InfoLink {
            linked,
            code: code as usize
        }
    );
    // Without its entry-point mark, `scale` is not a kernel.
    let mut cubin = elementwise_cubin();
    let other = st_other_offset(&cubin, "scale");
    assert_eq!(cubin[other] & 0x10, 0x10);
    cubin[other] &= !0x10;
    assert_eq!(
        cubin_kernel_layouts(&cubin).unwrap(),
        [layout("axpy", &[(0, 8), (8, 8), (16, 4), (20, 4)])]
    );
    assert_eq!(kernel_layout(&cubin, "scale").unwrap(), None);
    // A cubin cut before the end of its section table is an error; one cut after it (in the
    // program headers) still has everything the layouts are read from.
    let cubin = elementwise_cubin();
    let shoff = u64::from_le_bytes(cubin[0x28..0x30].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(cubin[0x3c..0x3e].try_into().unwrap()) as usize;
    let table_end = shoff + shnum * 64;
    let whole = cubin_kernel_layouts(&cubin).unwrap();
    for len in (0..cubin.len()).step_by(3) {
        let cut = cubin_kernel_layouts(&cubin[..len]);
        if len < table_end {
            assert!(cut.is_err(), "cut at {len}: {cut:?}");
        } else {
            assert_eq!(cut.as_ref(), Ok(&whole), "cut at {len}");
        }
    }
}

#[test]
fn cubin_errors_say_kernel_section_and_offset() {
    let (cubin, at) = with_scale_param_2(|r| r[0] = 9);
    assert_eq!(
        cubin_kernel_layouts(&cubin).unwrap_err().to_string(),
        format!(
            "cubin (kernel `scale`): `.nv.info.scale`, record at byte {at}: unknown record format 0x9"
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Large parameters (EIATTR_KPARAM_INFO_V2)
// ---------------------------------------------------------------------------------------------

/// The PTX (compute_75) and cubins of `tests/fixtures/large_params.cu`, as nvcc 13.0 builds them
/// (`tests/fixtures/make.sh`; `MADE` there lists the commands).
const LARGE_PARAMS: [(&str, &[u8]); 5] = [
    (
        "large_params.ptx",
        include_bytes!("fixtures/large_params.ptx"),
    ),
    (
        "large_params.sm_75.cubin",
        include_bytes!("fixtures/large_params.sm_75.cubin"),
    ),
    (
        "large_params.sm_80.cubin",
        include_bytes!("fixtures/large_params.sm_80.cubin"),
    ),
    (
        "large_params.sm_90.cubin",
        include_bytes!("fixtures/large_params.sm_90.cubin"),
    ),
    (
        "large_params.sm_120.cubin",
        include_bytes!("fixtures/large_params.sm_120.cubin"),
    ),
];

/// The sm_90 cubin of `large_params.cu`.
fn large_params_cubin() -> Vec<u8> {
    LARGE_PARAMS[3].1.to_vec()
}

/// The kernels of `tests/fixtures/large_params.cu`, written by hand from it (sorted by name):
/// structs take their size and their members' alignment, `Wide` 16; a pointer, `double` and
/// `long long` 8 bytes.
fn large_params_from_source() -> Vec<KernelLayout> {
    // many(long long* out, 600 long longs, char last)
    let many: Vec<(usize, usize)> = (0..601).map(|i| (8 * i, 8)).chain([(4808, 1)]).collect();
    vec![
        // at_old_limit(AtOldLimit (4344 bytes, 1-aligned), int*): 4352 bytes
        layout("at_old_limit", &[(0, 4344), (4344, 8)]),
        // block_then_pointer(Block (4400 bytes, 4-aligned), int*)
        layout("block_then_pointer", &[(0, 4400), (4400, 8)]),
        // char_last(int*, Block, char)
        layout("char_last", &[(0, 8), (8, 4400), (4408, 1)]),
        // largest(Largest (32760 bytes), int): 32764 bytes, the most a kernel may take
        layout("largest", &[(0, 32760), (32760, 4)]),
        layout("many", &many),
        // mixed(char, Small (404 bytes, 4-aligned), short, Block, double, int*, long long)
        layout(
            "mixed",
            &[
                (0, 1),
                (4, 404),
                (408, 2),
                (412, 4400),
                (4816, 8),
                (4824, 8),
                (4832, 8),
            ],
        ),
        // none()
        layout("none", &[]),
        // past_old_limit(PastOldLimit (4345 bytes), int*): 4360 bytes
        layout("past_old_limit", &[(0, 4345), (4352, 8)]),
        // scale(float*, float, unsigned)
        layout("scale", &[(0, 8), (8, 4), (12, 4)]),
        // wide(char, Wide (4416 bytes, 16-aligned), float, int*)
        layout("wide", &[(0, 1), (16, 4416), (4432, 4), (4440, 8)]),
    ]
}

/// The attributes of the parameter records of `.nv.info.KERNEL` in `cubin`, first to last.
fn param_record_kinds(cubin: &[u8], kernel: &str) -> Vec<u8> {
    let info = &cubin[section_range(cubin, &format!(".nv.info.{kernel}"))];
    let mut kinds = Vec::new();
    let mut at = 0;
    while at < info.len() {
        let (format, attribute) = (info[at], info[at + 1]);
        if matches!(attribute, 0x17 | 0x45) {
            kinds.push(attribute);
        }
        at += 4;
        if format == 4 {
            at += le::<2>(info, at - 2);
        }
    }
    kinds
}

#[test]
fn large_parameters_read_the_same_in_ptx_and_every_cubin_as_in_their_source() {
    for (name, blob) in LARGE_PARAMS {
        let expected = if name.ends_with(".ptx") {
            BlobKind::Ptx
        } else {
            BlobKind::Cubin
        };
        let kind = validate_blob(name, blob).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(kind, expected, "{name}");
        let layouts = by_name(kernel_layouts(blob).unwrap_or_else(|e| panic!("{name}: {e}")));
        assert_eq!(layouts, large_params_from_source(), "{name}");
        assert_well_formed(&layouts);
        if name.ends_with(".cubin") {
            // ptxas describes a kernel's parameters with KPARAM_INFO_V2 records past 4352 bytes,
            // with KPARAM_INFO records up to that bound.
            for kernel in &layouts {
                let kinds = param_record_kinds(blob, &kernel.name);
                assert_eq!(kinds.len(), kernel.params.len(), "{name}: {}", kernel.name);
                let v2 = kernel.param_bytes() > 4352;
                assert!(
                    kinds.iter().all(|&k| k == if v2 { 0x45 } else { 0x17 }),
                    "{name}: {} takes {} bytes, records {kinds:02x?}",
                    kernel.name,
                    kernel.param_bytes()
                );
            }
        }
    }
}

/// `mixed`'s record of the parameter of `ordinal` in the sm_90 cubin, changed by `change`, and
/// that record's offset in `.nv.info.mixed`.
fn with_mixed_record(ordinal: u16, change: impl FnOnce(&mut [u8])) -> (Vec<u8>, usize) {
    let mut cubin = large_params_cubin();
    let info = section_range(&cubin, ".nv.info.mixed");
    let mut head = [0x04, 0x45, 0x0c, 0x00, 0, 0, 0, 0, 0, 0].to_vec();
    head[8..10].copy_from_slice(&ordinal.to_le_bytes());
    let at = find_once(&cubin[info.clone()], &head);
    change(&mut cubin[info.start + at..info.start + at + 16]);
    (cubin, at)
}

#[test]
fn large_parameter_records_are_read_whole_and_checked_as_the_others() {
    let read = |cubin: &[u8]| kernel_layout(cubin, "mixed").unwrap().unwrap();
    let mixed = read(&large_params_cubin());
    // The size is the u16 after the offset; the u16 after it (the pointee's alignment and
    // space) says nothing of where the parameter lies.
    let (cubin, _) = with_mixed_record(5, |r| r[14..16].copy_from_slice(&[0xff, 0xff]));
    assert_eq!(read(&cubin), mixed);
    // Parameter 6 described by a KPARAM_INFO record (size in bits 18-31) among the
    // KPARAM_INFO_V2 ones: the same layout.
    let (cubin, _) = with_mixed_record(6, |r| {
        r[1] = 0x17;
        r[12..16].copy_from_slice(&(8u32 << 18 | 0x1f000).to_le_bytes());
    });
    assert_eq!(read(&cubin), mixed);
    // Block's size 4400 -> 4405: it overlaps the double after it, at 4816.
    let (cubin, _) = with_mixed_record(3, |r| r[12] = 0x35);
    assert_eq!(
        problem_of("mixed", &cubin),
        CubinProblem::Overlap {
            ordinal: 4,
            offset: 4816,
            previous_end: 4817
        }
    );
    // The last parameter's size 8 -> 16: past the 4840 bytes of the totals.
    let (cubin, _) = with_mixed_record(6, |r| r[12] = 16);
    assert_eq!(
        problem_of("mixed", &cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_CBANK_PARAM_SIZE",
            declared: 4840,
            records_end: 4848
        }
    );
    // Ordinals repeated across the two kinds.
    let (cubin, _) = with_mixed_record(6, |r| {
        r[1] = 0x17;
        r[8] = 5;
        r[12..16].copy_from_slice(&(8u32 << 18 | 0x1f000).to_le_bytes());
    });
    assert_eq!(
        problem_of("mixed", &cubin),
        CubinProblem::DuplicateOrdinal { ordinal: 5 }
    );
    // A record of 8 bytes.
    let (cubin, at) = with_mixed_record(2, |r| r[2] = 8);
    assert_eq!(
        problem_of("mixed", &cubin),
        CubinProblem::Record {
            section: ".nv.info.mixed".into(),
            at,
            issue: RecordIssue::Shape {
                attribute: 0x45,
                format: 4,
                len: 8
            }
        }
    );
    // A KPARAM_INFO record read as KPARAM_INFO_V2 takes its size from the low 16 bits of the
    // last word: scale's third parameter is then 0xf000 bytes long.
    let (cubin, _) = with_scale_param_2(|r| r[1] = 0x45);
    assert_eq!(
        scale_problem(&cubin),
        CubinProblem::TotalMismatch {
            attribute: "EIATTR_CBANK_PARAM_SIZE",
            declared: 16,
            records_end: 12 + 0xf000
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Random mutations of the committed blobs
// ---------------------------------------------------------------------------------------------

/// Every committed blob: each model's PTX and cubins, the fatbin, and the PTX and cubins of
/// `large_params.cu`.
fn committed_blobs() -> Vec<&'static [u8]> {
    let mut blobs = vec![ELEMENTWISE_FATBIN];
    blobs.extend(LARGE_PARAMS.iter().map(|(_, blob)| *blob));
    for model in MODELS {
        for set in [
            ptx_for_model(model).unwrap(),
            cubin_for_model(model, 90).unwrap(),
        ] {
            blobs.extend(set.iter().map(|(_, blob)| *blob));
        }
    }
    blobs
}

/// Reads `blob` every way there is; an error must render, a layout must be well formed.
fn read_every_way(blob: &[u8]) {
    match kernel_layouts(blob) {
        Ok(layouts) => {
            assert_well_formed(&layouts);
            for kernel in &layouts {
                assert_eq!(
                    kernel_layout(blob, &kernel.name).unwrap().as_ref(),
                    Some(kernel)
                );
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    for name in ["scale", "transform", "noop", "mixed"] {
        if let Ok(Some(kernel)) = kernel_layout(blob, name) {
            assert_well_formed(&[kernel]);
        }
    }
}

/// One edit: overwrite, insert or remove a byte, or cut the blob there.
fn edit(blob: &mut Vec<u8>, at: prop::sample::Index, byte: u8, kind: u8) {
    if blob.is_empty() {
        blob.push(byte);
        return;
    }
    let at = at.index(blob.len());
    match kind {
        0 => blob[at] = byte,
        1 => blob.insert(at, byte),
        2 => {
            blob.remove(at);
        }
        _ => blob.truncate(at),
    }
}

proptest! {
    // Cases: 256 by default, `PROPTEST_CASES` for more. A failure is saved beside this file, in
    // `param_layout.proptest-regressions`, and tried first on later runs.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Any committed blob with a few random edits anywhere: an error or a well-formed layout,
    /// never a panic.
    #[test]
    fn mutated_blobs_give_errors_or_well_formed_layouts(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..6),
    ) {
        let blobs = committed_blobs();
        let mut blob = blobs[which.index(blobs.len())].to_vec();
        for (at, byte, kind) in edits {
            edit(&mut blob, at, byte, kind);
        }
        read_every_way(&blob);
    }

    /// The elementwise cubin with random bytes of its `.nv.info` sections overwritten, where
    /// the parameter records are: an error or a well-formed layout, never a panic.
    #[test]
    fn mutated_info_records_give_errors_or_well_formed_layouts(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut cubin = elementwise_cubin();
        let ranges: Vec<Range<usize>> = [".nv.info", ".nv.info.scale", ".nv.info.axpy"]
            .iter()
            .map(|name| section_range(&cubin, name))
            .collect();
        let bytes: Vec<usize> = ranges.into_iter().flatten().collect();
        for (at, byte) in edits {
            cubin[bytes[at.index(bytes.len())]] = byte;
        }
        read_every_way(&cubin);
    }

    /// The sm_90 cubin of `large_params.cu` with random bytes of the `.nv.info` sections of
    /// `mixed` and `largest` (KPARAM_INFO_V2 records) overwritten: an error or a well-formed
    /// layout, never a panic.
    #[test]
    fn mutated_large_parameter_records_give_errors_or_well_formed_layouts(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut cubin = large_params_cubin();
        let bytes: Vec<usize> = [".nv.info.mixed", ".nv.info.largest"]
            .iter()
            .flat_map(|name| section_range(&cubin, name))
            .collect();
        for (at, byte) in edits {
            cubin[bytes[at.index(bytes.len())]] = byte;
        }
        read_every_way(&cubin);
    }

    /// Any text after a PTX header: an error or a well-formed layout, never a panic.
    #[test]
    fn arbitrary_ptx_text_gives_errors_or_well_formed_layouts(tail in ".{0,200}") {
        read_every_way(&ptx(&tail));
        read_every_way(&ptx(&format!(".entry k({tail}")));
    }
}

// ---------------------------------------------------------------------------------------------
// The driver's view (GPU)
// ---------------------------------------------------------------------------------------------

/// Offset and size of each parameter of `function` as `cuFuncGetParamInfo` reports them, to the
/// first index it refuses.
fn driver_slots(function: &atlas_registry::CudaFunction) -> Vec<ParamSlot> {
    // Binds the function's context and fails if the driver lacks the entry point.
    function
        .param_sizes()
        .unwrap()
        .expect("this driver has cuFuncGetParamInfo");
    let cuda = atlas_sys::driver().unwrap();
    let info = atlas_sys::entry!(cuda, cuFuncGetParamInfo).unwrap();
    let mut slots = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a live function of a live registry; both out-pointers are live locals.
        let status = unsafe { info(function.raw().raw(), slots.len(), &mut offset, &mut size) };
        if status != atlas_sys::CUresult::CUDA_SUCCESS {
            return slots;
        }
        slots.push(ParamSlot { offset, size });
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn blob_layouts_of_every_model_match_the_driver() {
    let mut checked = 0;
    for model in MODELS {
        for blobs in [
            ptx_for_model(model).unwrap(),
            cubin_for_model(model, 90).unwrap(),
        ] {
            let registry = AtlasRegistry::load(0, blobs)
                .unwrap_or_else(|e| panic!("{model} loads (this test needs an NVIDIA GPU): {e}"));
            for (module, blob) in blobs {
                let layouts = match kernel_layouts(blob) {
                    Ok(layouts) => layouts,
                    // The tensor map's offset is not in the PTX (the cubin's is checked).
                    Err(_) if ptx_layouts(stem(model, module), blob).is_none() => continue,
                    Err(e) => panic!("{model}/{module}: {e}"),
                };
                assert!(!layouts.is_empty(), "{model}/{module}");
                for kernel in layouts {
                    let function = registry.function(module, &kernel.name).unwrap();
                    let sizes = function
                        .param_sizes()
                        .unwrap()
                        .expect("this driver has cuFuncGetParamInfo");
                    assert_eq!(
                        sizes,
                        kernel.sizes().collect::<Vec<_>>(),
                        "{model}/{module}::{}",
                        kernel.name
                    );
                    assert_eq!(
                        driver_slots(&function),
                        kernel.params,
                        "{model}/{module}::{}",
                        kernel.name
                    );
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} kernels: blob layouts equal the driver's");
    // The 15 kernels of MODELS (9 of demo, model_a, model_b and faults; 4 of launch; 2 of
    // hopper), each as PTX and as the sm_90 cubin, but for the PTX of `tma_tiles`, whose layout
    // the PTX does not fix (its cubin's, which puts the tensor map at 48, is checked).
    assert_eq!(
        checked,
        2 * 15 - 1,
        "every kernel of every model, PTX and cubin"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ptx_layouts_of_every_type_and_alignment_match_the_driver() {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap())
        .unwrap_or_else(|e| panic!("this test needs an NVIDIA GPU: {e}"));
    // One module per case, between two one-byte parameters (so that alignment padding shows), so
    // that a declaration the JIT compiler refuses costs only its own case. The JIT refuses some
    // declarations the reader accepts (measured with driver 580: `.bf16`, `.bf16x2` and `.f16x2`
    // parameters, and declaration 4, a `.ptr.shared` pointer): a module it refuses cannot be
    // launched, so no layout of it is ever used; such cases are listed, and only those in
    // `REFUSED_BY_THE_JIT` may be refused.
    const REFUSED_BY_THE_JIT: &[&str] =
        &["type_bf16", "type_bf16x2", "type_f16x2", "declaration_4"];
    let mut modules: Vec<(String, String)> = SCALAR_TYPES
        .iter()
        .map(|(ty, _)| (format!("type_{}", &ty[1..]), between(ty)))
        .collect();
    let declarations = STRUCTS_AND_POINTERS
        .lines()
        .map(|line| line.trim().trim_end_matches(','))
        .filter(|line| line.starts_with(".param"));
    for (i, declaration) in declarations.enumerate() {
        modules.push((
            format!("declaration_{i}"),
            format!(
                "{HEAD}.visible .entry between(.param .u8 a, {declaration}, .param .u8 c)\n{{\n    ret;\n}}\n"
            ),
        ));
    }
    let mut failures = Vec::new();
    let mut refused = Vec::new();
    for (module, text) in &modules {
        let layouts = kernel_layouts(text.as_bytes()).unwrap();
        let registry = match AtlasRegistry::load(0, &[(module.as_str(), text.as_bytes())]) {
            Ok(registry) => registry,
            Err(e) => {
                let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
                println!("{module}: the driver refuses the module: {first_line}");
                refused.push(module.as_str());
                continue;
            }
        };
        for kernel in layouts {
            match registry.function(module, &kernel.name) {
                Ok(function) => {
                    let driver = driver_slots(&function);
                    if driver != kernel.params {
                        failures.push(format!(
                            "{module}: the driver says {driver:?}, the reader {:?}",
                            kernel.params
                        ));
                    }
                }
                Err(e) => failures.push(format!("{module}: {e}")),
            }
        }
    }
    for module in &refused {
        if !REFUSED_BY_THE_JIT.contains(module) {
            failures.push(format!("{module}: refused by the driver (see above)"));
        }
    }
    println!(
        "{} PTX modules checked, {} refused by the JIT",
        modules.len(),
        refused.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn large_parameter_layouts_match_the_driver() {
    let mut checked = 0;
    // The PTX (JIT-compiled for the device) and the sm_90 cubin.
    for (name, blob) in [LARGE_PARAMS[0], LARGE_PARAMS[3]] {
        let registry = AtlasRegistry::load(0, &[("large_params", blob)])
            .unwrap_or_else(|e| panic!("{name} loads (this test needs an NVIDIA GPU): {e}"));
        for kernel in kernel_layouts(blob).unwrap() {
            let function = registry.function("large_params", &kernel.name).unwrap();
            assert_eq!(
                driver_slots(&function),
                kernel.params,
                "{name}: {}",
                kernel.name
            );
            checked += 1;
        }
    }
    println!("{checked} kernels of large_params.cu: blob layouts equal the driver's");
    assert_eq!(checked, 2 * 10, "every kernel, PTX and sm_90 cubin");
}
