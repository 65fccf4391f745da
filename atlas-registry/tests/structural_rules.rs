//! Each structural rule of Atlas's blob checks against the driver: does the driver's loader need
//! it? A rule stays only where the driver, handed a blob that breaks it, reads outside the blob,
//! crashes or hangs; where the driver loads such blobs, or refuses them cleanly itself, the rule
//! refuses code for nothing (RELIABILITY.md, "Blob validation", rule 1).
//!
//! Every structural refusal that the ELF, cubin and fatbin checks make is a [`Rule`] below, with
//! where Atlas checks it and the words of its refusal. For each, mutants of real sm_90 code
//! break that rule and, as far as one change can, nothing else: cubins of nvcc 13.0
//! (`fixtures/elementwise.sm_90.zstd.fatbin`'s), NVIDIA's cuBLASLt 13.1
//! (`fixtures/crashes/cublasLt-13.1.0.3.fatbin-1323.fatbin`'s) and NVRTC 12.0 (atlas-kernels'
//! `elementwise`), and fatbins of nvcc 13.0 (plain, zstd, PTX alone) and NVRTC 12.0. A field
//! that points past a table is made to point past the end of the blob: the table is moved to the
//! end of the file first (`support/cubin.rs`), a change of layout that the controls show the
//! driver takes.
//!
//! - `every_mutant_breaks_its_rule` (no GPU): each mutant is refused by `validate_blob` with its
//!   rule's words, and every control and accepted layout passes.
//! - `gpu_structural_rules_against_the_driver` (`#[ignore]`d: it needs an NVIDIA GPU): hands
//!   each mutant to a plain `cuModuleLoadData` in child processes (`support/pool.rs`), twice:
//!   copied to end exactly where a `PROT_NONE` guard begins, and to start exactly where one
//!   ends (`support/guard.rs`), so that a read past the end or before the start faults even
//!   where it would otherwise go unnoticed. Prints a line per rule (mutants, loaded, clean error,
//!   crashed, faulted in a guard, hung, and the verdict) and writes every mutant's outcome to
//!   the file `ATLAS_STRUCTURAL_VERDICTS` names (default `target/structural_verdicts.tsv`,
//!   from the working directory); a run on the H200 is recorded by committing that file as
//!   `tests/fixtures/structural_verdicts.tsv`. It fails only when a control or an accepted
//!   layout does not load in both places (the sweep would prove nothing) or when Atlas passes a
//!   blob the driver crashes on, not on a verdict. RELIABILITY.md ("The sweep of structural
//!   rules") says how to apply a verdict.
//! - The two layouts accepted after such a measurement (a `PT_LOAD` whose file size exceeds its
//!   memory size, `SHF_INFO_LINK` with `sh_info` 0) are committed as cubins under
//!   `fixtures/accepted/` (`accepted_fixtures_are_the_mutants_they_say` makes them again;
//!   `ATLAS_WRITE_ACCEPTED_FIXTURES=1` writes them), `accepted_layouts_pass` checks them without
//!   a GPU and `gpu_accepted_layouts_load_through_atlas_and_the_plain_driver` on one.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use atlas_registry::{
    AtlasError, AtlasRegistry, kernel_layouts, validate_blob, validate_blob_for_device,
};
use support::blobs::NEEDS_GPU;
use support::child;
use support::cubin::{
    Cubin, PT_LOAD, SECTION_HEADER_SIZE, SH_ALIGN, SH_ENTSIZE, SH_FLAGS, SH_INFO, SH_LINK, SH_NAME,
    SH_OFFSET, SH_SIZE, SH_TYPE, SHF_COMPRESSED, SHF_INFO_LINK, SHT_CUDA_CALLGRAPH, SHT_DYNSYM,
    SHT_NOBITS, SYMBOL_SIZE,
};
use support::fatbin::{Fatbin, KIND_ELF, KIND_PTX, Scheme};
use support::guard::{self, EXIT_BEFORE_START, EXIT_PAST_END, Guarded, Place};
use support::pool::{self, Outcome};
use support::raw::{self, Raw};

child::bodies!(load_mutants, probe_guards);

/// A child silent this long on a load it started is stuck on it.
const HANG: Duration = Duration::from_secs(30);
/// Names the file the sweep writes its verdicts to.
const VERDICTS_ENV: &str = "ATLAS_STRUCTURAL_VERDICTS";
/// Set, `accepted_fixtures_are_the_mutants_they_say` writes the accepted fixtures.
const WRITE_ACCEPTED_ENV: &str = "ATLAS_WRITE_ACCEPTED_FIXTURES";

// ---------------------------------------------------------------------------------------------
// Sources
// ---------------------------------------------------------------------------------------------

/// What a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Cubin,
    Fatbin,
}

/// Real code to break.
struct Source {
    name: &'static str,
    form: Form,
    bytes: Vec<u8>,
}

/// nvcc 13.0's fatbin of `kernels/elementwise.cu` for sm_90: an sm_90 cubin and compute_90 PTX,
/// both zstd-compressed.
const NVCC_FATBIN: &[u8] = include_bytes!("fixtures/elementwise.sm_90.zstd.fatbin");
/// cuBLASLt 13.1's fatbin of one kernel: sm_90 and sm_120 cubins, zstd-compressed.
const CUBLASLT_FATBIN: &[u8] =
    include_bytes!("fixtures/crashes/cublasLt-13.1.0.3.fatbin-1323.fatbin");

/// The cubin of `fatbin`'s sm_90 entry.
fn sm90_cubin(fatbin: &[u8]) -> Vec<u8> {
    let fatbin = Fatbin::parse(fatbin).expect("a fatbin");
    let entry = fatbin
        .entries
        .iter()
        .find(|e| e.kind() == KIND_ELF && e.arch() == 90)
        .expect("an sm_90 entry");
    entry.contents().expect("its cubin")
}

/// nvcc 13.0's sm_90 cubin of `kernels/elementwise.cu`: the base of the accepted fixtures.
fn nvcc_cubin() -> Vec<u8> {
    sm90_cubin(NVCC_FATBIN)
}

/// Every source, in a fixed order (a child makes the same list).
fn sources() -> Vec<Source> {
    let nvrtc = atlas_kernels::cubin_for_model("demo", 90)
        .expect("the demo's sm_90 cubins")
        .iter()
        .find(|(name, _)| *name == "elementwise")
        .expect("elementwise")
        .1;
    let nvcc = Fatbin::parse(NVCC_FATBIN).expect("nvcc's fatbin");
    let plain: Vec<_> = nvcc
        .entries
        .iter()
        .map(|e| {
            e.restored(
                &e.contents().expect("an entry that decompresses"),
                Scheme::Plain,
            )
        })
        .collect();
    let ptx_alone: Vec<_> = plain
        .iter()
        .filter(|e| e.kind() == KIND_PTX)
        .cloned()
        .collect();
    vec![
        Source {
            name: "nvcc 13.0 sm_90 cubin",
            form: Form::Cubin,
            bytes: nvcc_cubin(),
        },
        Source {
            name: "cuBLASLt 13.1 sm_90 cubin",
            form: Form::Cubin,
            bytes: sm90_cubin(CUBLASLT_FATBIN),
        },
        Source {
            name: "NVRTC 12.0 sm_90 cubin",
            form: Form::Cubin,
            bytes: nvrtc.to_vec(),
        },
        Source {
            name: "nvcc 13.0 fatbin (sm_90, compute_90), plain",
            form: Form::Fatbin,
            bytes: nvcc.with_entries(plain).bytes(),
        },
        Source {
            name: "nvcc 13.0 fatbin (sm_90, compute_90), zstd",
            form: Form::Fatbin,
            bytes: NVCC_FATBIN.to_vec(),
        },
        Source {
            name: "nvcc 13.0 fatbin (compute_90 alone), plain",
            form: Form::Fatbin,
            bytes: nvcc.with_entries(ptx_alone).bytes(),
        },
        Source {
            name: "NVRTC 12.0 fatbin (compute_75, sm_75 to sm_90)",
            form: Form::Fatbin,
            bytes: atlas_kernels::ELEMENTWISE_FATBIN.to_vec(),
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

/// What kind of rule a rule is, for reading its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// An offset, size, count or index that a reader follows lies inside what it points into.
    Bounds,
    /// The layout Atlas reads: ELF64, little-endian, header and entry sizes, a compression it
    /// decodes. Without it Atlas would check a layout other than the one in the blob.
    Layout,
    /// The shape of a structure: alignments, the null section, one symbol table, no sections
    /// sharing bytes, a string table ending in a NUL, whole entries.
    Shape,
    /// A value of meaning that crashed the driver before (the one exception to rule 2).
    Measured,
    /// A layout Atlas refused once and now takes: expected to load.
    Accepted,
    /// Real code unchanged, or only laid out again: expected to load.
    Control,
    /// A rule relaxed after a sweep found that the driver does without it: its mutants pass
    /// Atlas, and the driver must neither crash on them nor read outside them. Relaxing a rule
    /// is deleting its check at its site and giving it this class.
    #[allow(
        dead_code,
        reason = "no rule is relaxed before the first sweep on a GPU"
    )]
    Relaxed,
    /// Code that passes Atlas in a format NVIDIA's driver does not read (a clang offload bundle,
    /// which SCALE's driver reads): what the driver does with it says whether the rules of that
    /// format can matter to it.
    Foreign,
}

impl Class {
    fn word(self) -> &'static str {
        match self {
            Class::Bounds => "bounds",
            Class::Layout => "layout",
            Class::Shape => "shape",
            Class::Measured => "measured",
            Class::Accepted => "accepted",
            Class::Control => "control",
            Class::Relaxed => "relaxed",
            Class::Foreign => "foreign",
        }
    }

    /// Whether its mutants must pass Atlas and load.
    fn must_load(self) -> bool {
        matches!(self, Class::Accepted | Class::Control)
    }

    /// Whether its mutants pass Atlas.
    fn passes(self) -> bool {
        self.must_load() || matches!(self, Class::Relaxed | Class::Foreign)
    }
}

/// Mutants a rule makes of a source: what each changes, and its bytes.
type Made = Vec<(String, Vec<u8>)>;

/// A structural rule of Atlas's checks.
struct Rule {
    /// `elf.section-bounds`: the name in the table and the verdict file.
    id: &'static str,
    class: Class,
    /// Where Atlas checks it: the place to relax it.
    site: &'static str,
    /// Atlas refuses a mutant with every word of one of these.
    refusal: &'static [&'static [&'static str]],
    form: Form,
    make: fn(&Source) -> Made,
}

const fn rule(
    id: &'static str,
    class: Class,
    site: &'static str,
    refusal: &'static [&'static [&'static str]],
    form: Form,
    make: fn(&Source) -> Made,
) -> Rule {
    Rule {
        id,
        class,
        site,
        refusal,
        form,
        make,
    }
}

/// 64 bytes before what an offset counts from, as a 64-bit offset.
const BACK_64: u64 = 0u64.wrapping_sub(64);
/// -64 as a 32-bit offset, for a reader that takes it as signed.
const BACK_32: u64 = 0xFFFF_FFC0;
/// A `.nv.info` record that holds nothing: format 1 (no value), attribute 0x01 (`PAD`).
const PAD_RECORD: [u8; 4] = [1, 1, 0, 0];

const KPARAM_INFO: u8 = 0x17;
const CBANK_PARAM_SIZE: u8 = 0x19;
const EXIT_INSTR_OFFSETS: u8 = 0x1c;
const MAXREG_COUNT: u8 = 0x1b;
const PARAM_CBANK: u8 = 0x0a;
const REGCOUNT: u8 = 0x2f;
const FRAME_SIZE: u8 = 0x11;
const MIN_STACK_SIZE: u8 = 0x12;
const MAX_STACK_SIZE: u8 = 0x23;
const SYSCALLS_FALLBACK: u8 = 0x5d;
const EXTERNS: u8 = 0x0f;
const LOAD_CACHE_REQUEST: u8 = 0x26;
const SAM_REGION_STACK_SIZE: u8 = 0x3b;
const JUMPTABLE_RELOCS: u8 = 0x03;

fn one(what: impl Into<String>, bytes: Vec<u8>) -> (String, Vec<u8>) {
    (what.into(), bytes)
}

fn cubin(s: &Source) -> Cubin {
    Cubin::new(&s.bytes)
}

/// `c` with section `i` moved to the end of the file.
fn at_end(c: &Cubin, i: usize) -> Cubin {
    let mut c = c.clone();
    c.move_to_end(i);
    c
}

/// `c` with the section header table moved to the end of the file.
fn headers_at_end(c: &Cubin) -> Cubin {
    let mut c = c.clone();
    c.headers_to_end();
    c
}

/// The sections that rules move to the end of the file, by what they are.
fn movable(c: &Cubin) -> Vec<(&'static str, usize)> {
    let named = |name: &str| c.index(name);
    [
        ("the symbol table", Some(c.symtab())),
        ("the string table", named(".strtab")),
        ("the section name table", named(".shstrtab")),
        (".debug_frame", named(".debug_frame")),
        ("the kernel's .nv.info", Some(c.kernel_info())),
        ("the kernel's code", Some(c.kernel_text())),
        ("the kernel's constant bank", Some(c.kernel_bank())),
        (".nv.compat", named(".nv.compat")),
        (".note.nv.tkinfo", named(".note.nv.tkinfo")),
        (".note.nv.cuinfo", named(".note.nv.cuinfo")),
    ]
    .into_iter()
    .filter_map(|(what, i)| Some((what, i?)))
    .collect()
}

/// Section `what` of [`movable`] at the end of the file, and its index; `None` when `c` has no
/// such section.
fn moved(c: &Cubin, what: &str) -> Option<(Cubin, usize)> {
    let (_, i) = movable(c).into_iter().find(|(w, _)| *w == what)?;
    Some((at_end(c, i), i))
}

/// The mutants of `make` applied to section `what` moved to the end, if `c` has it.
fn with_moved(c: &Cubin, what: &str, make: impl FnOnce(Cubin, usize) -> Made) -> Made {
    moved(c, what).map_or_else(Vec::new, |(c, i)| make(c, i))
}

/// The highest-ordinal `KPARAM_INFO` record of the kernel's `.nv.info`: relabelled or cut, the
/// kernel's other parameters stay numbered below their count.
fn last_param(c: &Cubin) -> support::cubin::Record {
    let info = c.kernel_info();
    c.records(info)
        .into_iter()
        .filter(|r| r.attribute == KPARAM_INFO)
        .max_by_key(|r| c.get(r.at + 8, 2))
        .expect("a KPARAM_INFO record")
}

/// A copy of `c` with record `r` cut to a value of `size` bytes, the rest of its bytes filled
/// with `PAD` records.
fn cut_record(c: &Cubin, r: support::cubin::Record, size: usize) -> Vec<u8> {
    let mut c = c.clone();
    c.put(r.at + 2, 2, size as u64);
    let kept = (4 + size).div_ceil(4) * 4;
    for at in (r.at + kept..r.at + r.span()).step_by(4) {
        c.b[at..at + 4].copy_from_slice(&PAD_RECORD);
    }
    c.b
}

/// The offset, in fatbin `f`'s bytes, of entry `i`.
fn entry_at(f: &Fatbin, i: usize) -> usize {
    f.header.len()
        + f.entries[..i]
            .iter()
            .map(|e| e.header.len() + e.payload.len())
            .sum::<usize>()
}

fn put(b: &mut [u8], at: usize, width: usize, value: u64) {
    for (i, byte) in b[at..at + width].iter_mut().enumerate() {
        *byte = (value >> (8 * i)) as u8;
    }
}

fn get(b: &[u8], at: usize, width: usize) -> u64 {
    b[at..at + width]
        .iter()
        .rev()
        .fold(0, |v, &byte| (v << 8) | u64::from(byte))
}

/// Fatbin `f` laid out with `width` bytes at `at` of entry `i`'s header set to `value`.
fn with_entry_field(f: &Fatbin, i: usize, at: usize, width: usize, value: u64) -> Vec<u8> {
    let mut f = f.clone();
    put(&mut f.entries[i].header, at, width, value);
    f.bytes()
}

/// The entries of fatbin `f` whose headers rules change: the ELF entry a device of sm_90 loads,
/// and the first PTX entry, with what each is.
fn entries_to_break(f: &Fatbin) -> Vec<(&'static str, usize)> {
    let elf = f
        .entries
        .iter()
        .position(|e| e.kind() == KIND_ELF && e.arch() == 90);
    let ptx = f.entries.iter().position(|e| e.kind() == KIND_PTX);
    [("the sm_90 ELF entry", elf), ("the PTX entry", ptx)]
        .into_iter()
        .filter_map(|(what, i)| Some((what, i?)))
        .collect()
}

/// The entries of fatbin `f` whose payloads are compressed.
fn compressed_entries(f: &Fatbin) -> Vec<usize> {
    (0..f.entries.len())
        .filter(|&i| matches!(f.entries[i].scheme(), Some(Scheme::Lz4 | Scheme::Zstd)))
        .collect()
}

fn fatbin(s: &Source) -> Fatbin {
    Fatbin::parse(&s.bytes).expect("a fatbin source")
}

/// Every rule, in the order of the table.
fn rules() -> Vec<Rule> {
    use Class::*;
    use Form::{Cubin as C, Fatbin as F};
    vec![
        // -------------------------------------------------------------------------------------
        // Controls and accepted layouts
        // -------------------------------------------------------------------------------------
        rule("control", Control, "-", &[], C, |s| {
            let c = cubin(s);
            let mut made = vec![
                one("as built", c.b.clone()),
                one("the section header table at the end", headers_at_end(&c).b),
            ];
            for (what, i) in movable(&c) {
                made.push(one(format!("{what} at the end"), at_end(&c, i).b));
            }
            made
        }),
        rule("control", Control, "-", &[], F, |s| {
            vec![one("as built", s.bytes.clone())]
        }),
        rule(
            "accepted.pt-load-file-past-memory",
            Accepted,
            "elf/mod.rs Elf::check_program_headers",
            &[],
            C,
            |s| {
                let c = cubin(s);
                let Some(n) = last_loaded_segment(&c) else {
                    return Vec::new();
                };
                let h = c.program_header(n);
                let memory = c.get(h + 40, 8);
                vec![one(
                    format!(
                        "program header {n}: file size {} = memory size + 2",
                        memory + 2
                    ),
                    c.with(h + 32, 8, memory + 2),
                )]
            },
        ),
        rule(
            "accepted.info-link-zero",
            Accepted,
            "elf/mod.rs Elf::check_flagged",
            &[],
            C,
            |s| {
                let c = cubin(s);
                let i = c
                    .index(".nv.shared.reserved.0")
                    .or_else(|| c.index(".debug_frame"))
                    .expect("a section to flag");
                let flags = c.field(i, SH_FLAGS) | SHF_INFO_LINK;
                vec![one(
                    format!("{} flagged SHF_INFO_LINK, sh_info 0", c.name(i)),
                    c.with_field(i, SH_FLAGS, flags),
                )]
            },
        ),
        // -------------------------------------------------------------------------------------
        // The blob, the ELF header
        // -------------------------------------------------------------------------------------
        rule(
            "blob.empty",
            Bounds,
            "blob/mod.rs check_known",
            &[&["the blob is empty"]],
            C,
            |s| {
                if s.name.starts_with("nvcc") {
                    vec![one("no bytes", Vec::new())]
                } else {
                    Vec::new()
                }
            },
        ),
        rule(
            "elf.header-bounds",
            Bounds,
            "elf/mod.rs Elf::parse",
            &[&["shorter than its 64-byte header"]],
            C,
            |s| {
                vec![
                    one("the first 63 bytes", s.bytes[..63].to_vec()),
                    one("the first 16 bytes", s.bytes[..16].to_vec()),
                ]
            },
        ),
        rule(
            "elf.class",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["not a 64-bit ELF file"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("EI_CLASS 1 (32-bit)", c.with(4, 1, 1)),
                    one("EI_CLASS 0", c.with(4, 1, 0)),
                ]
            },
        ),
        rule(
            "elf.data",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["not a little-endian"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("EI_DATA 2 (big-endian)", c.with(5, 1, 2)),
                    one("EI_DATA 0", c.with(5, 1, 0)),
                ]
            },
        ),
        rule(
            "elf.ident-version",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["identification version"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("EI_VERSION 0", c.with(6, 1, 0)),
                    one("EI_VERSION 2", c.with(6, 1, 2)),
                ]
            },
        ),
        rule(
            "elf.machine",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["an ELF file for machine"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_machine 62 (x86-64)", c.with(18, 2, 62)),
                    one("e_machine 0", c.with(18, 2, 0)),
                ]
            },
        ),
        rule(
            "elf.machine-amd-in-fatbin",
            Layout,
            "elf/mod.rs Elf::parse (Machines::Cuda)",
            &[&["(AMD GPU) inside an NVIDIA fatbin"]],
            F,
            |s| {
                let f = fatbin(s);
                let Some(i) = f
                    .entries
                    .iter()
                    .position(|e| e.kind() == KIND_ELF && e.arch() == 90)
                    .filter(|&i| f.entries[i].scheme() == Some(Scheme::Plain))
                else {
                    return Vec::new();
                };
                let mut f = f.clone();
                put(&mut f.entries[i].payload, 18, 2, 224);
                vec![one("the sm_90 cubin's e_machine 224 (AMD GPU)", f.bytes())]
            },
        ),
        rule(
            "elf.type",
            Shape,
            "elf/mod.rs Elf::parse",
            &[&["ELF file type"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_type 0 (none)", c.with(16, 2, 0)),
                    one("e_type 4 (core)", c.with(16, 2, 4)),
                ]
            },
        ),
        rule(
            "elf.ehsize",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["e_ehsize is"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_ehsize 52", c.with(52, 2, 52)),
                    one("e_ehsize 0xffff", c.with(52, 2, 0xffff)),
                ]
            },
        ),
        rule(
            "elf.phnum-extended",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["extended program header numbering"]],
            C,
            |s| vec![one("e_phnum 0xffff", cubin(s).with(56, 2, 0xffff))],
        ),
        rule(
            "elf.phentsize",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["e_phentsize is"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_phentsize 32", c.with(54, 2, 32)),
                    one("e_phentsize 64", c.with(54, 2, 64)),
                ]
            },
        ),
        rule(
            "elf.shnum-extended",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["extended section numbering"]],
            C,
            |s| vec![one("e_shnum 0, e_shoff kept", cubin(s).with(60, 2, 0))],
        ),
        rule(
            "elf.no-section-table",
            Shape,
            "elf/mod.rs Elf::parse",
            &[&["without a section header table"]],
            C,
            |s| {
                let mut c = cubin(s);
                c.put(60, 2, 0).put(40, 8, 0);
                vec![one("e_shnum 0, e_shoff 0", c.b)]
            },
        ),
        rule(
            "elf.shnum-reserved",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["reserved range"]],
            C,
            |s| {
                // A table of 0xff00 headers, null ones after the real ones, so that only the count
                // is wrong.
                let mut c = headers_at_end(&cubin(s));
                let more = 0xff00 - c.shnum();
                c.b.resize(c.len() + more * SECTION_HEADER_SIZE, 0);
                c.put(60, 2, 0xff00);
                vec![one(
                    "e_shnum 0xff00, the table padded with null sections to match",
                    c.b,
                )]
            },
        ),
        rule(
            "elf.shentsize",
            Layout,
            "elf/mod.rs Elf::parse",
            &[&["e_shentsize is"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_shentsize 40", c.with(58, 2, 40)),
                    one("e_shentsize 128", c.with(58, 2, 128)),
                ]
            },
        ),
        rule(
            "elf.sht-bounds",
            Bounds,
            "elf/mod.rs check_table (section header table)",
            &[&["the section header table (", "is past the end"]],
            C,
            |s| {
                let c = cubin(s);
                let end = headers_at_end(&c);
                let bytes = (SECTION_HEADER_SIZE * c.shnum()) as u64;
                vec![
                    one(
                        "the table at the end, e_shnum one more",
                        end.with(60, 2, end.shnum() as u64 + 1),
                    ),
                    one(
                        "e_shoff at the end of the blob",
                        c.with(40, 8, c.len() as u64),
                    ),
                    one(
                        "e_shoff: the table ends where the blob starts",
                        c.with(40, 8, 0u64.wrapping_sub(bytes)),
                    ),
                ]
            },
        ),
        rule(
            "elf.sht-overlaps-header",
            Shape,
            "elf/mod.rs check_table (section header table)",
            &[&["section header table at offset", "overlaps the ELF header"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_shoff 0", c.with(40, 8, 0)),
                    one("e_shoff 8", c.with(40, 8, 8)),
                ]
            },
        ),
        rule(
            "elf.shstrndx",
            Bounds,
            "elf/mod.rs Elf::parse",
            &[&["e_shstrndx", "is not one of the"]],
            C,
            |s| {
                let c = cubin(s);
                let end = headers_at_end(&c);
                vec![
                    one("e_shstrndx 0", c.with(62, 2, 0)),
                    one(
                        "e_shstrndx e_shnum, the table at the end",
                        end.with(62, 2, end.shnum() as u64),
                    ),
                    one("e_shstrndx 0xfeff", c.with(62, 2, 0xfeff)),
                ]
            },
        ),
        rule(
            "elf.shstrtab-type",
            Shape,
            "elf/mod.rs Elf::parse",
            &[&["(the section name table, e_shstrndx): type"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one(
                    "e_shstrndx names the symbol table",
                    c.with(62, 2, c.symtab() as u64),
                )]
            },
        ),
        rule(
            "elf.shstrtab-bounds",
            Bounds,
            "elf/mod.rs Elf::parse",
            &[&[
                "(the section name table, e_shstrndx): offset",
                "is past the end",
            ]],
            C,
            |s| {
                let c = cubin(s);
                let mut made = with_moved(&c, "the section name table", |c, i| {
                    vec![one(
                        "at the end, sh_size one more",
                        c.with_field(i, SH_SIZE, c.size(i) as u64 + 1),
                    )]
                });
                let i = c.get(62, 2) as usize;
                made.push(one(
                    "sh_offset 64 before the blob",
                    c.with_field(i, SH_OFFSET, BACK_64),
                ));
                made
            },
        ),
        rule(
            "elf.shstrtab-nul",
            Bounds,
            "elf/mod.rs Elf::parse",
            &[&["(the section name table, e_shstrndx): does not end with a NUL"]],
            C,
            |s| {
                with_moved(&cubin(s), "the section name table", |mut c, i| {
                    let size = c.size(i) - 1;
                    c.set(i, SH_SIZE, size as u64);
                    vec![one(
                        "at the end without its last NUL: the last name runs to the end of the blob",
                        c.truncated(c.offset(i) + size),
                    )]
                })
            },
        ),
        // -------------------------------------------------------------------------------------
        // Program headers
        // -------------------------------------------------------------------------------------
        rule(
            "elf.pht-bounds",
            Bounds,
            "elf/mod.rs check_table (program header table)",
            &[&["the program header table (", "is past the end"]],
            C,
            |s| {
                let c = cubin(s);
                let bytes = (56 * c.phnum()) as u64;
                let mut made = vec![
                    one(
                        "e_phoff at the end of the blob",
                        c.with(32, 8, c.len() as u64),
                    ),
                    one(
                        "e_phoff: the table ends where the blob starts",
                        c.with(32, 8, 0u64.wrapping_sub(bytes)),
                    ),
                ];
                // The table ends the file in these cubins: one more header is past the end.
                if c.phoff() + 56 * c.phnum() == c.len() {
                    made.push(one("e_phnum one more", c.with(56, 2, c.phnum() as u64 + 1)));
                }
                made
            },
        ),
        rule(
            "elf.pht-overlaps-header",
            Shape,
            "elf/mod.rs check_table (program header table)",
            &[&["program header table at offset", "overlaps the ELF header"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("e_phoff 0", c.with(32, 8, 0)),
                    one("e_phoff 8", c.with(32, 8, 8)),
                ]
            },
        ),
        rule(
            "elf.segment-bounds",
            Bounds,
            "elf/mod.rs Elf::check_program_headers",
            &[&["(type 0x", "is past the end"]],
            C,
            |s| {
                let c = cubin(s);
                let Some(n) = last_loaded_segment(&c) else {
                    return Vec::new();
                };
                let h = c.program_header(n);
                let (offset, file, memory) = (c.get(h + 8, 8), c.get(h + 32, 8), c.get(h + 40, 8));
                let len = c.len() as u64;
                let mut longer = c.clone();
                let file_to_end = len - offset + 1;
                longer
                    .put(h + 32, 8, file_to_end)
                    .put(h + 40, 8, memory.max(file_to_end));
                vec![
                    one(
                        format!(
                            "program header {n}: p_offset so that it ends 1 byte past the blob"
                        ),
                        c.with(h + 8, 8, len - file + 1),
                    ),
                    one(
                        format!("program header {n}: p_filesz to 1 byte past the blob"),
                        longer.b,
                    ),
                    one(
                        format!("program header {n}: p_offset 64 before the blob"),
                        c.with(h + 8, 8, BACK_64),
                    ),
                ]
            },
        ),
        // -------------------------------------------------------------------------------------
        // Sections
        // -------------------------------------------------------------------------------------
        rule(
            "elf.section0",
            Shape,
            "elf/mod.rs Elf::check_sections",
            &[&["section 0 has a non-zero byte"]],
            C,
            |s| {
                let c = cubin(s);
                vec![
                    one("section 0 sh_type PROGBITS", c.with_field(0, SH_TYPE, 1)),
                    one("section 0 sh_name 1", c.with_field(0, SH_NAME, 1)),
                ]
            },
        ),
        rule(
            "elf.two-symbol-tables",
            Shape,
            "elf/mod.rs Elf::check_sections",
            &[&["are both symbol tables"]],
            C,
            |s| {
                let c = cubin(s);
                let symtab = c.symtab();
                let data = c.data(symtab).to_vec();
                let mut copy = c.clone();
                copy.add_section(c.header_bytes(symtab), Some(&data));
                let mut dynamic = c.clone();
                let mut header = c.header_bytes(symtab);
                header[4..8].copy_from_slice(&SHT_DYNSYM.to_le_bytes());
                dynamic.add_section(header, Some(&data));
                vec![
                    one("a copy of the symbol table added", copy.b),
                    one("a copy of the symbol table added as SHT_DYNSYM", dynamic.b),
                ]
            },
        ),
        rule(
            "elf.no-symtab",
            Shape,
            "elf/mod.rs Elf::check_sections",
            &[&["without a symbol table"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one(
                    "the symbol table typed SHT_DYNSYM",
                    c.with_field(c.symtab(), SH_TYPE, SHT_DYNSYM.into()),
                )]
            },
        ),
        rule(
            "elf.sections-overlap",
            Shape,
            "elf/mod.rs Elf::check_sections",
            &[&["overlap; sections of an ELF file do not"]],
            C,
            |s| {
                let c = cubin(s);
                let info = c.index(".nv.info").expect(".nv.info");
                let mut copy = c.clone();
                copy.add_section(c.header_bytes(info), None);
                vec![one("a second .nv.info over the bytes of the first", copy.b)]
            },
        ),
        rule(
            "elf.section-name",
            Bounds,
            "elf/mod.rs Elf::check_section",
            &[&["its name offset", "-byte section name table"]],
            C,
            |s| {
                let c = cubin(s);
                let text = c.kernel_text();
                let mut made = with_moved(&c, "the section name table", |c, i| {
                    vec![one(
                        "the kernel code's sh_name: the end of the name table, at the end",
                        c.with_field(text, SH_NAME, c.size(i) as u64),
                    )]
                });
                made.push(one(
                    "the kernel code's sh_name -64",
                    c.with_field(text, SH_NAME, BACK_32),
                ));
                made
            },
        ),
        rule(
            "elf.section-bounds",
            Bounds,
            "elf/mod.rs Elf::data",
            &[&[
                "section ",
                "is past the end of the",
                "(truncated or corrupt)",
            ]],
            C,
            |s| {
                let c = cubin(s);
                let (text, bank) = (c.kernel_text(), c.kernel_bank());
                let len = c.len() as u64;
                let mut made = vec![
                    one(
                        "the kernel's code: sh_offset so that it ends 1 byte past the blob",
                        c.with_field(text, SH_OFFSET, len - c.size(text) as u64 + 1),
                    ),
                    one(
                        "the kernel's code: sh_offset 64 before the blob",
                        c.with_field(text, SH_OFFSET, BACK_64),
                    ),
                    one(
                        "the kernel's constant bank: sh_size 1 TiB",
                        c.with_field(bank, SH_SIZE, 1 << 40),
                    ),
                ];
                for (what, more) in [
                    (".debug_frame", 1),
                    ("the symbol table", SYMBOL_SIZE),
                    ("the kernel's .nv.info", 4),
                ] {
                    made.extend(with_moved(&c, what, |c, i| {
                        vec![one(
                            format!("{what} at the end, {more} byte(s) longer"),
                            c.with_field(i, SH_SIZE, (c.size(i) + more) as u64),
                        )]
                    }));
                }
                made
            },
        ),
        rule(
            "elf.section-align",
            Shape,
            "elf/mod.rs Elf::check_section",
            &[&["is not a power of two"]],
            C,
            |s| {
                let c = cubin(s);
                let frame = c.index(".debug_frame").expect(".debug_frame");
                vec![
                    one(
                        "the kernel's code aligned to 96",
                        c.with_field(c.kernel_text(), SH_ALIGN, 96),
                    ),
                    one(
                        ".debug_frame aligned to 3",
                        c.with_field(frame, SH_ALIGN, 3),
                    ),
                ]
            },
        ),
        rule(
            "elf.section-link",
            Bounds,
            "elf/mod.rs Elf::check_section",
            &[&["sh_link", "is not one of the"]],
            C,
            |s| {
                let c = cubin(s);
                let end = headers_at_end(&c);
                let info = c.index(".nv.info").expect(".nv.info");
                let rela = relocations(&c);
                vec![
                    one(
                        "the symbol table's sh_link e_shnum, the table at the end",
                        end.with_field(c.symtab(), SH_LINK, end.shnum() as u64),
                    ),
                    one(
                        "the relocations' sh_link e_shnum, the table at the end",
                        end.with_field(rela, SH_LINK, end.shnum() as u64),
                    ),
                    one(
                        ".nv.info's sh_link 0xffffffff",
                        c.with_field(info, SH_LINK, 0xffff_ffff),
                    ),
                ]
            },
        ),
        rule(
            "elf.info-link",
            Bounds,
            "elf/mod.rs Elf::check_flagged",
            &[&["flagged as a section index (SHF_INFO_LINK)"]],
            C,
            |s| {
                let c = cubin(s);
                let frame = c.index(".debug_frame").expect(".debug_frame");
                let flags = c.field(frame, SH_FLAGS) | SHF_INFO_LINK;
                let mut end = headers_at_end(&c);
                end.set(frame, SH_FLAGS, flags);
                let shnum = end.shnum() as u64;
                let mut far = c.clone();
                far.set(frame, SH_FLAGS, flags);
                vec![
                    one(
                        ".debug_frame flagged, sh_info e_shnum, the table at the end",
                        end.with_field(frame, SH_INFO, shnum),
                    ),
                    one(
                        ".debug_frame flagged, sh_info 0xffffffff",
                        far.with_field(frame, SH_INFO, 0xffff_ffff),
                    ),
                ]
            },
        ),
        rule(
            "elf.compressed-section",
            Bounds,
            "elf/mod.rs Elf::check_compressed",
            &[&["flagged compressed (SHF_COMPRESSED)"]],
            C,
            |s| {
                let c = cubin(s);
                let frame = c.index(".debug_frame").expect(".debug_frame");
                let bank = c.kernel_bank();
                vec![
                    one(
                        ".debug_frame flagged SHF_COMPRESSED",
                        c.with_field(frame, SH_FLAGS, c.field(frame, SH_FLAGS) | SHF_COMPRESSED),
                    ),
                    one(
                        "the kernel's constant bank flagged SHF_COMPRESSED",
                        c.with_field(bank, SH_FLAGS, c.field(bank, SH_FLAGS) | SHF_COMPRESSED),
                    ),
                ]
            },
        ),
        rule(
            "elf.strtab-nul",
            Bounds,
            "elf/mod.rs Elf::check_section",
            &[&["the string table does not end with a NUL"]],
            C,
            |s| {
                with_moved(&cubin(s), "the string table", |mut c, i| {
                    let size = c.size(i) - 1;
                    c.set(i, SH_SIZE, size as u64);
                    vec![one(
                        "at the end without its last NUL: the last name runs to the end of the blob",
                        c.truncated(c.offset(i) + size),
                    )]
                })
            },
        ),
        // -------------------------------------------------------------------------------------
        // Symbols
        // -------------------------------------------------------------------------------------
        rule(
            "elf.symtab-link",
            Bounds,
            "elf/mod.rs Elf::strings",
            &[&["which is not a string table"]],
            C,
            |s| {
                let c = cubin(s);
                let symtab = c.symtab();
                let frame = c.index(".debug_frame").expect(".debug_frame");
                vec![
                    one(
                        "the symbol table linked to .debug_frame",
                        c.with_field(symtab, SH_LINK, frame as u64),
                    ),
                    one(
                        "the symbol table linked to itself",
                        c.with_field(symtab, SH_LINK, symtab as u64),
                    ),
                ]
            },
        ),
        rule(
            "elf.table-link",
            Bounds,
            "elf/mod.rs Elf::check_sections (Elf::symbols, Elf::strings)",
            &[
                &["which is not a symbol table"],
                &["which is not a string table"],
            ],
            C,
            |s| {
                let c = cubin(s);
                let frame = c.index(".debug_frame").expect(".debug_frame");
                let strtab = c.index(".strtab").expect(".strtab") as u64;
                let typed = |kind: u64, link: u64| {
                    let mut c = c.clone();
                    c.set(frame, SH_TYPE, kind).set(frame, SH_LINK, link);
                    c.b
                };
                vec![
                    one(
                        ".debug_frame typed SHT_HASH, linked to section 0",
                        typed(5, 0),
                    ),
                    one(
                        ".debug_frame typed SHT_GROUP, linked to .strtab",
                        typed(17, strtab),
                    ),
                    one(
                        ".debug_frame typed SHT_DYNAMIC, linked to section 0",
                        typed(6, 0),
                    ),
                ]
            },
        ),
        rule(
            "elf.symtab-entsize",
            Layout,
            "elf/mod.rs Elf::symbols",
            &[&["a symbol table has whole 24-byte entries"]],
            C,
            |s| {
                let c = cubin(s);
                let symtab = c.symtab();
                let mut made = vec![
                    one("sh_entsize 16", c.with_field(symtab, SH_ENTSIZE, 16)),
                    one("sh_entsize 48", c.with_field(symtab, SH_ENTSIZE, 48)),
                ];
                made.extend(with_moved(&c, "the symbol table", |mut c, i| {
                    let size = c.size(i) - 1;
                    c.set(i, SH_SIZE, size as u64);
                    vec![one(
                        "at the end, its last symbol's last byte past the end of the blob",
                        c.truncated(c.offset(i) + size),
                    )]
                }));
                made
            },
        ),
        rule(
            "elf.symtab-info",
            Bounds,
            "elf/mod.rs Elf::check_symbols",
            &[&["(its first global symbol) is past its"]],
            C,
            |s| {
                with_moved(&cubin(s), "the symbol table", |c, i| {
                    vec![
                        one(
                            "at the end, sh_info the count + 1",
                            c.with_field(i, SH_INFO, c.symbols() as u64 + 1),
                        ),
                        one("sh_info 0xffffffff", c.with_field(i, SH_INFO, 0xffff_ffff)),
                    ]
                })
            },
        ),
        rule(
            "elf.symbol0",
            Shape,
            "elf/mod.rs Elf::check_symbols",
            &[&["symbol 0 is not all zeros"]],
            C,
            |s| {
                let c = cubin(s);
                let at = c.symbol(0);
                vec![
                    one("symbol 0's st_name 1", c.with(at, 4, 1)),
                    one("symbol 0's st_shndx 1", c.with(at + 6, 2, 1)),
                ]
            },
        ),
        rule(
            "elf.symbol-name",
            Bounds,
            "elf/mod.rs Elf::symbol_fault (Name)",
            &[&["its name offset", "-byte string table"]],
            C,
            |s| {
                let c = cubin(s);
                let kernel = c.kernel_symbol();
                let mut made = with_moved(&c, "the string table", |c, i| {
                    vec![one(
                        "the kernel's st_name: the end of the string table, at the end",
                        c.with(c.symbol(kernel), 4, c.size(i) as u64),
                    )]
                });
                made.push(one(
                    "the kernel's st_name -64",
                    c.with(c.symbol(kernel), 4, BACK_32),
                ));
                made
            },
        ),
        rule(
            "elf.symbol-reserved",
            Shape,
            "elf/mod.rs Elf::symbol_fault (Reserved)",
            &[&["one of them is reserved"]],
            C,
            |s| {
                let c = cubin(s);
                let at = c.symbol(c.kernel_symbol()) + 4;
                let info = c.get(at, 1);
                vec![
                    one("the kernel's binding 3", c.with(at, 1, 0x30 | (info & 0xf))),
                    one("the kernel's type 8", c.with(at, 1, (info & 0xf0) | 8)),
                ]
            },
        ),
        rule(
            "elf.symbol-xindex",
            Layout,
            "elf/mod.rs Elf::symbol_fault (ExtendedIndex)",
            &[&["SHN_XINDEX"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one(
                    "the kernel's st_shndx 0xffff",
                    c.with(c.symbol(c.kernel_symbol()) + 6, 2, 0xffff),
                )]
            },
        ),
        rule(
            "elf.symbol-section",
            Bounds,
            "elf/mod.rs Elf::symbol_fault (NoSection)",
            &[&["symbol ", "section index", "is not one of the"]],
            C,
            |s| {
                let c = cubin(s);
                let kernel = c.kernel_symbol();
                let end = headers_at_end(&c);
                vec![
                    one(
                        "the kernel's st_shndx e_shnum, the table at the end",
                        end.with(end.symbol(kernel) + 6, 2, end.shnum() as u64),
                    ),
                    one(
                        "the kernel's st_shndx 0xfeff",
                        c.with(c.symbol(kernel) + 6, 2, 0xfeff),
                    ),
                ]
            },
        ),
        rule(
            "elf.symbol-reserved-index",
            Shape,
            "elf/mod.rs Elf::symbol_fault (ReservedIndex)",
            &[&["section index 0x", "is reserved"]],
            C,
            |s| {
                let c = cubin(s);
                let at = c.symbol(c.kernel_symbol()) + 6;
                vec![
                    one(
                        "the kernel's st_shndx 0xff00 (SHN_LOPROC)",
                        c.with(at, 2, 0xff00),
                    ),
                    one("the kernel's st_shndx 0xff05", c.with(at, 2, 0xff05)),
                ]
            },
        ),
        rule(
            "elf.symbol-range",
            Bounds,
            "elf/mod.rs Elf::symbol_fault (PastSection)",
            &[&["value", "is past the end of section"]],
            C,
            |s| {
                let c = cubin(s);
                let kernel = c.kernel_symbol();
                with_moved(&c, "the kernel's code", |c, _| {
                    let at = c.symbol(kernel);
                    vec![
                        one(
                            "code at the end, the kernel's st_size 16 more",
                            c.with(at + 16, 8, c.get(at + 16, 8) + 16),
                        ),
                        one(
                            "the kernel's st_value -16",
                            c.with(at + 8, 8, 0u64.wrapping_sub(16)),
                        ),
                    ]
                })
            },
        ),
        // -------------------------------------------------------------------------------------
        // Relocations
        // -------------------------------------------------------------------------------------
        rule(
            "elf.rel-entsize",
            Layout,
            "elf/mod.rs Elf::check_relocations",
            &[&["table has whole"]],
            C,
            |s| {
                let c = cubin(s);
                let rela = relocations(&c);
                vec![
                    one(
                        "sh_entsize 16 (REL's) in a RELA table",
                        c.with_field(rela, SH_ENTSIZE, 16),
                    ),
                    one(
                        "sh_size 8 less",
                        c.with_field(rela, SH_SIZE, c.size(rela) as u64 - 8),
                    ),
                ]
            },
        ),
        rule(
            "elf.rel-target-zero",
            Shape,
            "elf/mod.rs Elf::check_relocations",
            &[&["names no section to relocate"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one("sh_info 0", c.with_field(relocations(&c), SH_INFO, 0))]
            },
        ),
        rule(
            "elf.rel-target",
            Bounds,
            "elf/mod.rs Elf::check_relocations",
            &[
                &["the section it relocates"],
                &["flagged as a section index"],
            ],
            C,
            |s| {
                let c = cubin(s);
                let rela = relocations(&c);
                let end = headers_at_end(&c);
                vec![
                    one(
                        "sh_info e_shnum, the table at the end",
                        end.with_field(rela, SH_INFO, end.shnum() as u64),
                    ),
                    one(
                        "sh_info 0xffffffff",
                        c.with_field(rela, SH_INFO, 0xffff_ffff),
                    ),
                ]
            },
        ),
        rule(
            "elf.rel-symbol",
            Bounds,
            "elf/mod.rs Elf::check_relocations",
            &[&["relocation 0: symbol index"]],
            C,
            |s| {
                with_moved(&cubin(s), "the symbol table", |c, _| {
                    let at = c.offset(relocations(&c)) + 12;
                    vec![
                        one(
                            "symbols at the end, relocation 0's symbol the count",
                            c.with(at, 4, c.symbols() as u64),
                        ),
                        one(
                            "relocation 0's symbol 0xffffffff",
                            c.with(at, 4, 0xffff_ffff),
                        ),
                    ]
                })
            },
        ),
        rule(
            "elf.rel-type",
            Bounds,
            "elf/mod.rs Elf::check_relocations (cuda::is_relocation_type)",
            &[&["is neither an R_CUDA type"]],
            C,
            |s| {
                let c = cubin(s);
                let at = c.offset(relocations(&c)) + 8;
                vec![
                    one("relocation 0's type 0x100", c.with(at, 4, 0x100)),
                    one("relocation 0's type 0xffffffff", c.with(at, 4, 0xffff_ffff)),
                ]
            },
        ),
        rule(
            "elf.rel-offset",
            Bounds,
            "elf/mod.rs Elf::check_relocations",
            &[&["relocation 0: offset", "bytes is past the end of"]],
            C,
            |s| {
                with_moved(&cubin(s), ".debug_frame", |c, frame| {
                    let rela = relocations(&c);
                    assert_eq!(
                        c.field(rela, SH_INFO) as usize,
                        frame,
                        "the relocations of .debug_frame"
                    );
                    let at = c.offset(rela);
                    // R_CUDA_64 (2) rewrites 8 bytes.
                    let width = if c.get(at + 8, 4) == 2 { 8 } else { 1 };
                    let size = c.size(frame) as u64;
                    vec![
                        one(
                            ".debug_frame at the end, relocation 0 rewrites 1 byte past it",
                            c.with(at, 8, size - width + 1),
                        ),
                        one(
                            "relocation 0's offset -8",
                            c.with(at, 8, 0u64.wrapping_sub(8)),
                        ),
                    ]
                })
            },
        ),
        // -------------------------------------------------------------------------------------
        // Notes
        // -------------------------------------------------------------------------------------
        rule(
            "elf.note-bounds",
            Bounds,
            "elf/mod.rs Elf::check_notes",
            &[&["runs past the end of the"]],
            C,
            |s| {
                with_moved(&cubin(s), ".note.nv.cuinfo", |c, i| {
                    let note = c.notes(i)[0];
                    vec![
                        one(
                            "at the end, its note's descsz 4 more",
                            c.with(note.at + 4, 4, note.desc_size as u64 + 4),
                        ),
                        one(
                            "its note's namesz 0xffffffff",
                            c.with(note.at, 4, 0xffff_ffff),
                        ),
                    ]
                })
            },
        ),
        rule(
            "elf.tkinfo-short",
            Bounds,
            "elf/cuda.rs check_note",
            &[&["shorter than the 24 bytes"]],
            C,
            |s| {
                let c = cubin(s);
                let Some(i) = c.index(".note.nv.cuinfo") else {
                    return Vec::new();
                };
                let note = c.notes(i)[0];
                assert!(note.desc_size < 24, "a short note to retype");
                vec![one(
                    format!(
                        ".note.nv.cuinfo's note ({} bytes) typed a toolkit note (2000)",
                        note.desc_size
                    ),
                    c.with(note.at + 8, 4, 2000),
                )]
            },
        ),
        rule(
            "elf.tkinfo-strings",
            Bounds,
            "elf/cuda.rs check_note",
            &[&["is not a NUL-terminated string inside"]],
            C,
            |s| {
                with_moved(&cubin(s), ".note.nv.tkinfo", |c, i| {
                    let note = c.notes(i)[0];
                    let strings = note.desc_size as u64 - 24;
                    // Word 2: the tool name's offset.
                    let tool = note.desc_at + 8;
                    vec![
                        one(
                            "at the end, the tool name at the end of its strings",
                            c.with(tool, 4, strings),
                        ),
                        one(
                            "the tool name offset 0x96000001",
                            c.with(tool, 4, 0x9600_0001),
                        ),
                        one(
                            "the object file name offset -64",
                            c.with(note.desc_at + 4, 4, BACK_32),
                        ),
                    ]
                })
            },
        ),
        // -------------------------------------------------------------------------------------
        // NVIDIA's parts of a cubin
        // -------------------------------------------------------------------------------------
        rule(
            "cuda.eflags-crashing-bit",
            Measured,
            "elf/cuda.rs check_flags",
            &[&["which no CUDA toolchain sets"]],
            C,
            |s| {
                let c = cubin(s);
                let (bit, what) = if c.b[8] == 8 {
                    (1, "bit 0 (ABI 8)")
                } else {
                    (0x8000_0000, "bit 31 (ABI 7)")
                };
                vec![one(
                    format!("e_flags {what}"),
                    c.with(48, 4, c.get(48, 4) | bit),
                )]
            },
        ),
        rule(
            "cuda.eflags-sm",
            Measured,
            "elf/cuda.rs check_flags",
            &[&["not an SM number"]],
            C,
            |s| {
                let c = cubin(s);
                let flags = c.get(48, 4);
                let sm_shift = if c.b[8] == 8 { 8 } else { 0 };
                let with_sm =
                    |shift: u64, sm: u64| c.with(48, 4, (flags & !(0xff << shift)) | sm << shift);
                vec![
                    one("SM 255", with_sm(sm_shift, 255)),
                    one("SM 19", with_sm(sm_shift, 19)),
                    one("virtual SM 255", with_sm(16, 255)),
                ]
            },
        ),
        rule(
            "cuda.data-owner",
            Bounds,
            "elf/cuda.rs check_section (DataOwner)",
            &[
                &["the code section this belongs to"],
                &["flagged as a section index"],
            ],
            C,
            |s| {
                let c = cubin(s);
                let end = headers_at_end(&c);
                let shnum = end.shnum() as u64;
                let mut made = vec![
                    one(
                        "the kernel's constant bank: sh_info e_shnum, the table at the end",
                        end.with_field(c.kernel_bank(), SH_INFO, shnum),
                    ),
                    one(
                        "the kernel's constant bank: sh_info 0xffffffff",
                        c.with_field(c.kernel_bank(), SH_INFO, 0xffff_ffff),
                    ),
                ];
                if let Some(shared) = c.index(".nv.shared.reserved.0") {
                    assert_eq!(c.kind(shared), SHT_NOBITS);
                    made.push(one(
                        ".nv.shared.reserved.0: sh_info e_shnum, the table at the end",
                        end.with_field(shared, SH_INFO, shnum),
                    ));
                }
                made
            },
        ),
        rule(
            "cuda.code-symbol",
            Bounds,
            "elf/cuda.rs check_section (CodeSymbol)",
            &[&["names symbol"]],
            C,
            |s| {
                with_moved(&cubin(s), "the symbol table", |c, _| {
                    let text = c.kernel_text();
                    let high = c.field(text, SH_INFO) & 0xff00_0000;
                    vec![
                        one(
                            "symbols at the end, the kernel code's sh_info the symbol count",
                            c.with_field(text, SH_INFO, high | c.symbols() as u64),
                        ),
                        one(
                            "the kernel code's sh_info symbol 0xffffff",
                            c.with_field(text, SH_INFO, high | 0x00ff_ffff),
                        ),
                    ]
                })
            },
        ),
        rule(
            "cuda.callgraph-shape",
            Shape,
            "elf/cuda.rs check_callgraph",
            &[&["a call graph has whole 8-byte entries"]],
            C,
            |s| {
                let c = cubin(s);
                let Some(graph) = c.of_kind(SHT_CUDA_CALLGRAPH) else {
                    return Vec::new();
                };
                vec![
                    one("sh_entsize 4", c.with_field(graph, SH_ENTSIZE, 4)),
                    one(
                        "sh_size 4 less",
                        c.with_field(graph, SH_SIZE, c.size(graph) as u64 - 4),
                    ),
                ]
            },
        ),
        rule(
            "cuda.callgraph-caller",
            Bounds,
            "elf/cuda.rs check_callgraph",
            &[&["entry 0: symbol index"]],
            C,
            |s| {
                with_moved(&cubin(s), "the symbol table", |c, _| {
                    let Some(graph) = c.of_kind(SHT_CUDA_CALLGRAPH) else {
                        return Vec::new();
                    };
                    let at = c.offset(graph);
                    vec![
                        one(
                            "symbols at the end, entry 0's caller the symbol count",
                            c.with(at, 4, c.symbols() as u64),
                        ),
                        one("entry 0's caller 0xffffffef", c.with(at, 4, 0xffff_ffef)),
                    ]
                })
            },
        ),
        rule(
            "cuda.record-header-bounds",
            Bounds,
            "elf/cuda.rs check_info, walk_records (HeaderPastEnd)",
            &[&["its 4-byte header is past the end"]],
            C,
            |s| {
                let c = cubin(s);
                let mut made = Vec::new();
                for what in ["the kernel's .nv.info", ".nv.compat"] {
                    made.extend(with_moved(&c, what, |mut c, i| {
                        let last = *c.records(i).last().expect("records");
                        let size = last.at + 2 - c.offset(i);
                        c.set(i, SH_SIZE, size as u64);
                        vec![one(
                            format!("{what} at the end, cut 2 bytes into its last record's header"),
                            c.truncated(last.at + 2),
                        )]
                    }));
                }
                made
            },
        ),
        rule(
            "cuda.record-format",
            Shape,
            "elf/cuda.rs check_info, walk_records (Format)",
            &[&["has format 0x"]],
            C,
            |s| {
                let c = cubin(s);
                let mut made = vec![one(
                    "the kernel's first record of format 7",
                    c.with(c.offset(c.kernel_info()), 1, 7),
                )];
                if let Some(compat) = c.index(".nv.compat") {
                    made.push(one(
                        ".nv.compat's first record of format 0",
                        c.with(c.offset(compat), 1, 0),
                    ));
                }
                made
            },
        ),
        rule(
            "cuda.record-value-bounds",
            Bounds,
            "elf/cuda.rs check_info, walk_records (ValuePastEnd)",
            &[&["-byte value is past the end of the"]],
            C,
            |s| {
                let c = cubin(s);
                let mut made = Vec::new();
                for what in ["the kernel's .nv.info", ".nv.compat"] {
                    made.extend(with_moved(&c, what, |c, i| {
                        let last = *c.records(i).last().expect("records");
                        assert_eq!(last.format, 4, "{what} ends with a sized record");
                        vec![
                            one(
                                format!("{what} at the end, its last value 4 bytes longer"),
                                c.with(last.at + 2, 2, last.size as u64 + 4),
                            ),
                            one(
                                format!("{what}: its last value 0xffff bytes"),
                                c.with(last.at + 2, 2, 0xffff),
                            ),
                        ]
                    }));
                }
                made
            },
        ),
        rule(
            "cuda.info-owner",
            Bounds,
            "elf/cuda.rs check_info",
            &[
                &["section index", "is not one of the"],
                &["flagged as a section index"],
            ],
            C,
            |s| {
                let c = cubin(s);
                let end = headers_at_end(&c);
                vec![one(
                    "the kernel's .nv.info: sh_info e_shnum, the table at the end",
                    end.with_field(c.kernel_info(), SH_INFO, end.shnum() as u64),
                )]
            },
        ),
        rule(
            "cuda.info-unsized",
            Bounds,
            "elf/cuda.rs check_info (Unsized)",
            &[&["which only a sized record (format 4) has room for"]],
            C,
            |s| {
                let c = cubin(s);
                let r = c
                    .record(c.kernel_info(), MAXREG_COUNT)
                    .expect("MAXREG_COUNT");
                assert_eq!(r.format, 3);
                vec![
                    one(
                        "MAXREG_COUNT (a half word) relabelled REGCOUNT",
                        c.with(r.at + 1, 1, REGCOUNT.into()),
                    ),
                    one(
                        "MAXREG_COUNT (a half word) relabelled SYSCALLS_FALLBACK",
                        c.with(r.at + 1, 1, SYSCALLS_FALLBACK.into()),
                    ),
                ]
            },
        ),
        info_symbol("cuda.info-symbol.regcount", REGCOUNT),
        info_symbol("cuda.info-symbol.frame-size", FRAME_SIZE),
        info_symbol("cuda.info-symbol.min-stack-size", MIN_STACK_SIZE),
        info_symbol("cuda.info-symbol.max-stack-size", MAX_STACK_SIZE),
        info_symbol("cuda.info-symbol.param-cbank", PARAM_CBANK),
        info_symbol("cuda.info-symbol.externs", EXTERNS),
        info_symbol("cuda.info-symbol.syscalls-fallback", SYSCALLS_FALLBACK),
        info_symbol("cuda.info-symbol.load-cache-request", LOAD_CACHE_REQUEST),
        info_symbol(
            "cuda.info-symbol.sam-region-stack-size",
            SAM_REGION_STACK_SIZE,
        ),
        rule(
            "cuda.info-no-symbol",
            Bounds,
            "elf/cuda.rs check_info (NoSymbol)",
            &[&["hold no symbol index"]],
            C,
            |s| {
                let c = cubin(s);
                let info = c.index(".nv.info").expect(".nv.info");
                let r = c.record(info, REGCOUNT).expect("REGCOUNT");
                vec![one(
                    "REGCOUNT's value cut to 2 bytes, PAD after",
                    cut_record(&c, r, 2),
                )]
            },
        ),
        rule(
            "cuda.syscalls-pairs",
            Shape,
            "elf/cuda.rs check_info (Pairs)",
            &[&["not whole pairs of symbol indexes"]],
            C,
            |s| {
                let mut c = cubin(s);
                let r = last_param(&c);
                let kernel = c.kernel_symbol() as u64;
                c.put(r.at + 1, 1, SYSCALLS_FALLBACK.into());
                for word in 0..3 {
                    c.put(r.at + 4 + 4 * word, 4, kernel);
                }
                vec![one(
                    "the last KPARAM_INFO made a SYSCALLS_FALLBACK of 3 symbol indexes",
                    c.b,
                )]
            },
        ),
        rule(
            "cuda.param-cbank-placement",
            Bounds,
            "elf/cuda.rs check_info (NoPlacement)",
            &[&["no parameter offset and size"]],
            C,
            |s| {
                let c = cubin(s);
                let r = c.record(c.kernel_info(), PARAM_CBANK).expect("PARAM_CBANK");
                vec![one(
                    "PARAM_CBANK's value cut to its symbol, PAD after",
                    cut_record(&c, r, 4),
                )]
            },
        ),
        rule(
            "cuda.param-cbank-bank",
            Bounds,
            "elf/cuda.rs check_info (Bank)",
            &[&["parameters at offset", "are past the end of"]],
            C,
            |s| {
                with_moved(&cubin(s), "the kernel's constant bank", |c, bank| {
                    let r = c.record(c.kernel_info(), PARAM_CBANK).expect("PARAM_CBANK");
                    let placement = c.get(r.at + 8, 4);
                    let offset = placement & 0xffff;
                    let size = c.size(bank) as u64 - offset + 1;
                    vec![
                        one(
                            "the bank at the end, the parameters 1 byte past it",
                            c.with(r.at + 8, 4, offset | size << 16),
                        ),
                        one(
                            "the parameters at offset 0xffff",
                            c.with(r.at + 8, 4, (placement & !0xffff) | 0xffff),
                        ),
                    ]
                })
            },
        ),
        rule(
            "cuda.kparam-short",
            Bounds,
            "elf/cuda.rs check_info (ShortParam)",
            &[&["not the 12 of a parameter description"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one(
                    "the last KPARAM_INFO cut to 8 bytes, PAD after",
                    cut_record(&c, last_param(&c), 8),
                )]
            },
        ),
        rule(
            "cuda.kparam-ordinal",
            Bounds,
            "elf/cuda.rs check_info (Ordinal)",
            &[&["but the kernel has"]],
            C,
            |s| {
                let c = cubin(s);
                let info = c.kernel_info();
                let count = c
                    .records(info)
                    .iter()
                    .filter(|r| r.attribute == KPARAM_INFO)
                    .count();
                let at = last_param(&c).at + 8;
                vec![
                    one(
                        "the last parameter's ordinal the count",
                        c.with(at, 2, count as u64),
                    ),
                    one("the last parameter's ordinal 0xffff", c.with(at, 2, 0xffff)),
                ]
            },
        ),
        rule(
            "cuda.kparam-past-bank",
            Bounds,
            "elf/cuda.rs check_info (PastParams)",
            &[&["bytes of parameters"]],
            C,
            |s| {
                let c = cubin(s);
                let bank = c
                    .record(c.kernel_info(), CBANK_PARAM_SIZE)
                    .expect("CBANK_PARAM_SIZE");
                let bytes = c.get(bank.at + 2, 2);
                let r = last_param(&c);
                let size = c.get(r.at + 12, 4) >> 18;
                vec![
                    one(
                        "the last parameter 4 bytes past the parameter bank",
                        c.with(r.at + 10, 2, bytes - size + 4),
                    ),
                    one(
                        "the last parameter at offset 0xfffc",
                        c.with(r.at + 10, 2, 0xfffc),
                    ),
                ]
            },
        ),
        rule(
            "cuda.exit-offset",
            Bounds,
            "elf/cuda.rs check_info (Exit)",
            &[&["instruction offset", "is past the end of"]],
            C,
            |s| {
                with_moved(&cubin(s), "the kernel's code", |c, text| {
                    let r = c
                        .record(c.kernel_info(), EXIT_INSTR_OFFSETS)
                        .expect("EXIT_INSTR_OFFSETS");
                    vec![
                        one(
                            "code at the end, an exit at its end",
                            c.with(r.at + 4, 4, c.size(text) as u64),
                        ),
                        one("an exit at 0xfffffff0", c.with(r.at + 4, 4, 0xffff_fff0)),
                    ]
                })
            },
        ),
        rule(
            "cuda.jumptable-relocs",
            Measured,
            "elf/cuda.rs check_info (Crashes)",
            &[&["JUMPTABLE_RELOCS"]],
            C,
            |s| {
                let c = cubin(s);
                vec![one(
                    "the last KPARAM_INFO relabelled JUMPTABLE_RELOCS",
                    c.with(last_param(&c).at + 1, 1, JUMPTABLE_RELOCS.into()),
                )]
            },
        ),
        // -------------------------------------------------------------------------------------
        // Fatbins
        // -------------------------------------------------------------------------------------
        rule(
            "fatbin.header-bounds",
            Bounds,
            "fatbin.rs entries",
            &[&["shorter than its 16-byte header"]],
            F,
            |s| {
                vec![
                    one("the first 15 bytes", s.bytes[..15].to_vec()),
                    one("the first 8 bytes", s.bytes[..8].to_vec()),
                ]
            },
        ),
        rule(
            "fatbin.version",
            Layout,
            "fatbin.rs entries",
            &[&["fatbin version"]],
            F,
            |s| {
                let mut two = s.bytes.clone();
                put(&mut two, 4, 2, 2);
                let mut zero = s.bytes.clone();
                put(&mut zero, 4, 2, 0);
                vec![one("version 2", two), one("version 0", zero)]
            },
        ),
        rule(
            "fatbin.body-bounds",
            Bounds,
            "fatbin.rs entries",
            &[&["its header declares"]],
            F,
            |s| {
                let body = get(&s.bytes, 8, 8);
                let with = |at, width, value| {
                    let mut b = s.bytes.clone();
                    put(&mut b, at, width, value);
                    b
                };
                vec![
                    one("the body 8 bytes past the blob", with(8, 8, body + 8)),
                    one(
                        "the body 2^64 - 16 bytes",
                        with(8, 8, 0u64.wrapping_sub(16)),
                    ),
                    one("a header of 8 bytes", with(6, 2, 8)),
                ]
            },
        ),
        rule(
            "fatbin.no-entries",
            Shape,
            "fatbin.rs entries",
            &[&["the fatbin has no entries"]],
            F,
            |s| {
                let mut b = s.bytes[..16].to_vec();
                put(&mut b, 8, 8, 0);
                vec![one("the header alone, an empty body", b)]
            },
        ),
        rule(
            "fatbin.entry-room",
            Bounds,
            "fatbin.rs Entries::next",
            &[&["has no room for its"]],
            F,
            |s| {
                let mut b = s.bytes.clone();
                let body = get(&b, 8, 8);
                put(&mut b, 8, 8, body + 8);
                b.extend_from_slice(&[0; 8]);
                vec![one("8 zero bytes after the last entry, in the body", b)]
            },
        ),
        rule(
            "fatbin.entry-bounds",
            Bounds,
            "fatbin.rs Entries::next",
            &[&["-byte header and a", "the fatbin ends at"]],
            F,
            |s| {
                let f = fatbin(s);
                let last = f.entries.len() - 1;
                let payload = get(&f.entries[last].header, 8, 8);
                let mut longer = f.bytes();
                put(&mut longer, entry_at(&f, last) + 8, 8, payload + 8);
                vec![
                    one("the last entry's payload 8 bytes past the blob", longer),
                    one(
                        "the last entry's header size 32",
                        with_entry_field(&f, last, 4, 4, 32),
                    ),
                    one(
                        "the last entry's header size 0xffffffff",
                        with_entry_field(&f, last, 4, 4, 0xffff_ffff),
                    ),
                ]
            },
        ),
        rule(
            "fatbin.entry-version",
            Layout,
            "fatbin.rs check_header",
            &[&["entry version"]],
            F,
            |s| {
                let f = fatbin(s);
                entries_to_break(&f)
                    .into_iter()
                    .flat_map(|(what, i)| {
                        [
                            one(
                                format!("{what}: version 0x0102"),
                                with_entry_field(&f, i, 2, 2, 0x0102),
                            ),
                            one(
                                format!("{what}: version 0"),
                                with_entry_field(&f, i, 2, 2, 0),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.plain-sizes",
            Shape,
            "fatbin.rs check_sizes",
            &[&["an uncompressed entry"]],
            F,
            |s| {
                let f = fatbin(s);
                entries_to_break(&f)
                    .into_iter()
                    .filter(|&(_, i)| f.entries[i].scheme() == Some(Scheme::Plain))
                    .flat_map(|(what, i)| {
                        let payload = get(&f.entries[i].header, 8, 8);
                        [
                            one(
                                format!("{what}: compressed size 16"),
                                with_entry_field(&f, i, 16, 4, 16),
                            ),
                            one(
                                format!("{what}: uncompressed size its payload's"),
                                with_entry_field(&f, i, 56, 8, payload),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.compressed-size",
            Bounds,
            "fatbin.rs check_sizes",
            &[&["compressed size", "does not fit the"]],
            F,
            |s| {
                let f = fatbin(s);
                compressed_entries(&f)
                    .into_iter()
                    .flat_map(|i| {
                        let payload = get(&f.entries[i].header, 8, 8);
                        let what = f.entries[i].describe();
                        [
                            one(
                                format!("{what}: compressed size 0"),
                                with_entry_field(&f, i, 16, 4, 0),
                            ),
                            one(
                                format!("{what}: compressed size its payload + 1"),
                                with_entry_field(&f, i, 16, 4, payload + 1),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.uncompressed-size",
            Shape,
            "fatbin.rs check_sizes",
            &[&["declares no uncompressed size"]],
            F,
            |s| {
                let f = fatbin(s);
                compressed_entries(&f)
                    .into_iter()
                    .map(|i| {
                        one(
                            format!("{}: uncompressed size 0", f.entries[i].describe()),
                            with_entry_field(&f, i, 56, 8, 0),
                        )
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.compression",
            Layout,
            "fatbin.rs code (Stored::Unknown)",
            &[&["name a compression Atlas cannot read"]],
            F,
            |s| {
                let f = fatbin(s);
                compressed_entries(&f)
                    .into_iter()
                    .flat_map(|i| {
                        let flags = get(&f.entries[i].header, 40, 8);
                        let what = f.entries[i].describe();
                        [
                            one(
                                format!("{what}: flag 0x1000 for its compression"),
                                with_entry_field(&f, i, 40, 8, (flags & !0xa000) | 0x1000),
                            ),
                            one(
                                format!("{what}: flags 0x2000 and 0x8000"),
                                with_entry_field(&f, i, 40, 8, flags | 0xa000),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.name",
            Bounds,
            "fatbin.rs check_header (string_in_header)",
            &[&["its name at offset"]],
            F,
            |s| {
                let f = fatbin(s);
                let len = f.bytes().len() as u64;
                entries_to_break(&f)
                    .into_iter()
                    .flat_map(|(what, i)| {
                        let to_end = len - entry_at(&f, i) as u64;
                        let name = |offset: u64, size: u64| {
                            let mut g = f.clone();
                            put(&mut g.entries[i].header, 32, 4, offset);
                            put(&mut g.entries[i].header, 36, 4, size);
                            g.bytes()
                        };
                        [
                            one(
                                format!("{what}: a name at the end of the blob, size 0"),
                                name(to_end, 0),
                            ),
                            one(
                                format!("{what}: a name at the end of the blob, size 1"),
                                name(to_end, 1),
                            ),
                            one(format!("{what}: a name at offset -64"), name(BACK_32, 1)),
                            one(
                                format!("{what}: a name at offset 16, in the fixed header"),
                                name(16, 4),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.options-record",
            Bounds,
            "fatbin.rs check_header",
            &[&["its options record at offset"]],
            F,
            |s| {
                let f = fatbin(s);
                let len = f.bytes().len() as u64;
                entries_to_break(&f)
                    .into_iter()
                    .flat_map(|(what, i)| {
                        let to_end = len - entry_at(&f, i) as u64;
                        [
                            one(
                                format!("{what}: the options record at the end of the blob"),
                                with_entry_field(&f, i, 20, 4, to_end),
                            ),
                            one(
                                format!("{what}: the options record at offset -64"),
                                with_entry_field(&f, i, 20, 4, BACK_32),
                            ),
                            one(
                                format!(
                                    "{what}: the options record at offset 8, in the fixed header"
                                ),
                                with_entry_field(&f, i, 20, 4, 8),
                            ),
                        ]
                    })
                    .collect()
            },
        ),
        rule(
            "fatbin.options",
            Bounds,
            "fatbin.rs check_header (string_in_header)",
            &[&["its options at offset"]],
            F,
            |s| {
                let f = fatbin(s);
                let len = f.bytes().len() as u64;
                let mut made = Vec::new();
                for (what, i) in entries_to_break(&f) {
                    let record = get(&f.entries[i].header, 20, 4) as usize;
                    if record == 0 || f.entries[i].kind() != KIND_PTX {
                        continue;
                    }
                    let to_end = len - entry_at(&f, i) as u64;
                    let (offset, size) = (
                        get(&f.entries[i].header, record, 4),
                        get(&f.entries[i].header, record + 4, 4),
                    );
                    let mut unterminated = f.clone();
                    unterminated.entries[i].header[(offset + size) as usize] = b'x';
                    made.push(one(
                        format!("{what}: options at the end of the blob"),
                        with_entry_field(&f, i, record, 4, to_end),
                    ));
                    made.push(one(
                        format!("{what}: options of 0xffff bytes"),
                        with_entry_field(&f, i, record + 4, 4, 0xffff),
                    ));
                    made.push(one(
                        format!("{what}: the options' NUL overwritten"),
                        unterminated.bytes(),
                    ));
                }
                made
            },
        ),
        rule(
            "fatbin.ptx-nul",
            Bounds,
            "fatbin.rs check_code",
            &[&["has no terminating NUL byte"]],
            F,
            |s| {
                let f = fatbin(s);
                if f.entries.len() != 1
                    || f.entries[0].kind() != KIND_PTX
                    || f.entries[0].scheme() != Some(Scheme::Plain)
                {
                    return Vec::new();
                }
                let mut g = f.clone();
                for byte in g.entries[0].payload.iter_mut().filter(|b| **b == 0) {
                    *byte = b' ';
                }
                vec![one(
                    "the PTX's NULs made spaces: the text runs to the end of the blob",
                    g.bytes(),
                )]
            },
        ),
        // -------------------------------------------------------------------------------------
        // Clang offload bundles
        // -------------------------------------------------------------------------------------
        rule("bundle.nvidia-driver", Foreign, "bundle.rs", &[], F, |s| {
            let f = fatbin(s);
            let Some(elf) = f.entries.iter().find(|e| {
                e.kind() == KIND_ELF && e.arch() == 90 && e.scheme() == Some(Scheme::Plain)
            }) else {
                return Vec::new();
            };
            let id = b"cuda-nvptx64-nvidia-cuda-sm_90";
            let mut b = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
            let code_at = b.len() + 8 + 24 + id.len();
            for word in [1, code_at, elf.payload.len(), id.len()] {
                b.extend_from_slice(&(word as u64).to_le_bytes());
            }
            b.extend_from_slice(id);
            b.extend_from_slice(&elf.payload);
            vec![one("a bundle of the sm_90 cubin, which Atlas passes", b)]
        }),
    ]
}

/// A rule on the first word (a symbol index) of the first record of `attribute`: in the global
/// `.nv.info`, or the kernel's for `PARAM_CBANK`. The sources hold no record of `EXTERNS`,
/// `SYSCALLS_FALLBACK`, `LOAD_CACHE_REQUEST` or `SAM_REGION_STACK_SIZE`: for those, the first
/// `REGCOUNT` record (two words) is relabelled, its second word the kernel's symbol.
fn info_symbol(id: &'static str, attribute: u8) -> Rule {
    // A `fn` pointer cannot capture `attribute`: one function per attribute.
    fn make<const A: u8>(s: &Source) -> Made {
        with_moved(&cubin(s), "the symbol table", |mut c, _| {
            let section = if A == PARAM_CBANK {
                c.kernel_info()
            } else {
                c.index(".nv.info").expect(".nv.info")
            };
            let relabel = matches!(
                A,
                EXTERNS | SYSCALLS_FALLBACK | LOAD_CACHE_REQUEST | SAM_REGION_STACK_SIZE
            );
            let from = if relabel { REGCOUNT } else { A };
            let Some(r) = c.record(section, from) else {
                return Vec::new();
            };
            let what = if relabel {
                let kernel = c.kernel_symbol() as u64;
                c.put(r.at + 1, 1, A.into()).put(r.at + 8, 4, kernel);
                "REGCOUNT relabelled, "
            } else {
                ""
            };
            vec![
                one(
                    format!("symbols at the end, {what}its symbol the count"),
                    c.with(r.at + 4, 4, c.symbols() as u64),
                ),
                one(
                    format!("{what}its symbol 0xffffffff"),
                    c.with(r.at + 4, 4, 0xffff_ffff),
                ),
            ]
        })
    }
    let make: fn(&Source) -> Made = match attribute {
        REGCOUNT => make::<REGCOUNT>,
        FRAME_SIZE => make::<FRAME_SIZE>,
        MIN_STACK_SIZE => make::<MIN_STACK_SIZE>,
        MAX_STACK_SIZE => make::<MAX_STACK_SIZE>,
        PARAM_CBANK => make::<PARAM_CBANK>,
        EXTERNS => make::<EXTERNS>,
        SYSCALLS_FALLBACK => make::<SYSCALLS_FALLBACK>,
        LOAD_CACHE_REQUEST => make::<LOAD_CACHE_REQUEST>,
        SAM_REGION_STACK_SIZE => make::<SAM_REGION_STACK_SIZE>,
        _ => unreachable!("an attribute of the table"),
    };
    rule(
        id,
        Class::Bounds,
        "elf/cuda.rs check_info (Symbol)",
        &[&["symbol index", "is past the"]],
        Form::Cubin,
        make,
    )
}

/// The last `PT_LOAD` segment with bytes in the file.
fn last_loaded_segment(c: &Cubin) -> Option<usize> {
    (0..c.phnum()).rev().find(|&n| {
        let h = c.program_header(n);
        c.get(h, 4) == u64::from(PT_LOAD) && c.get(h + 32, 8) > 0
    })
}

/// The relocation table of `.debug_frame`, which every source has.
fn relocations(c: &Cubin) -> usize {
    c.index(".rela.debug_frame")
        .or_else(|| c.index(".rel.debug_frame"))
        .expect("the relocations of .debug_frame")
}

// ---------------------------------------------------------------------------------------------
// Mutants
// ---------------------------------------------------------------------------------------------

/// One blob of the sweep.
struct Mutant {
    /// The index of its rule in [`rules`].
    rule: usize,
    source: &'static str,
    what: String,
    blob: Vec<u8>,
}

/// Every mutant of every rule, in a fixed order (a child makes the same list).
fn mutants(rules: &[Rule]) -> Vec<Mutant> {
    let sources = sources();
    let mut all = Vec::new();
    for (index, rule) in rules.iter().enumerate() {
        for source in sources.iter().filter(|s| s.form == rule.form) {
            for (what, blob) in (rule.make)(source) {
                all.push(Mutant {
                    rule: index,
                    source: source.name,
                    what,
                    blob,
                });
            }
        }
    }
    all
}

/// What Atlas says of a blob: `passes`, or its refusal.
fn atlas_verdict(blob: &[u8]) -> Result<(), String> {
    validate_blob("mutant", blob)
        .map(drop)
        .map_err(|e| match e {
            AtlasError::InvalidModule { reason, .. } => reason,
            other => other.to_string(),
        })
}

#[test]
fn every_mutant_breaks_its_rule() {
    let rules = rules();
    let mutants = mutants(&rules);
    let mut failures = Vec::new();
    // Fatbin mutants are laid out again from their parts: what changes is only what they change.
    for source in sources().iter().filter(|s| s.form == Form::Fatbin) {
        assert_eq!(fatbin(source).bytes(), source.bytes, "{}", source.name);
    }
    for (index, rule) in rules.iter().enumerate() {
        if !mutants.iter().any(|m| m.rule == index) {
            failures.push(format!("{}: no mutant", rule.id));
        }
    }
    for m in &mutants {
        let rule = &rules[m.rule];
        let label = format!("{} / {} / {}", rule.id, m.source, m.what);
        let verdict = atlas_verdict(&m.blob);
        println!(
            "{label}: {}",
            verdict.as_ref().err().map_or("passes", String::as_str)
        );
        match (rule.class.passes(), verdict) {
            (true, Ok(())) => {}
            (true, Err(reason)) => failures.push(format!("{label}: refused: {reason}")),
            (false, Ok(())) => failures.push(format!("{label}: passes")),
            (false, Err(reason)) => {
                if !rule
                    .refusal
                    .iter()
                    .any(|words| words.iter().all(|w| reason.contains(w)))
                {
                    failures.push(format!("{label}: refused for another rule: {reason}"));
                }
            }
        }
    }
    println!("{} rules, {} mutants", rules.len(), mutants.len());
    for failure in &failures {
        println!("FAIL {failure}");
    }
    assert!(
        failures.is_empty(),
        "{} failures, the first: {}",
        failures.len(),
        failures[0]
    );
}

// ---------------------------------------------------------------------------------------------
// The accepted layouts
// ---------------------------------------------------------------------------------------------

/// The accepted fixtures: file name, what it is, and how it is made from nvcc's cubin.
fn accepted() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let c = Cubin::new(&nvcc_cubin());
    let n = last_loaded_segment(&c).expect("a loaded segment");
    let h = c.program_header(n);
    let file_past_memory = c.with(h + 32, 8, c.get(h + 40, 8) + 2);
    let shared = c
        .index(".nv.shared.reserved.0")
        .expect(".nv.shared.reserved.0");
    assert_eq!(c.field(shared, SH_INFO), 0);
    let info_link_zero = c.with_field(shared, SH_FLAGS, c.field(shared, SH_FLAGS) | SHF_INFO_LINK);
    vec![
        (
            "elementwise.sm_90.pt_load_file_past_memory.cubin",
            "the last PT_LOAD's file size 2 bytes over its memory size, as CUDA 11.0's ptxas pads \
             .nv.global.init",
            file_past_memory,
        ),
        (
            "elementwise.sm_90.info_link_zero.cubin",
            ".nv.shared.reserved.0 flagged SHF_INFO_LINK with sh_info 0, as NVIDIA's Blackwell \
             cubins have it",
            info_link_zero,
        ),
    ]
}

fn accepted_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accepted")
}

/// The committed fixtures are nvcc's cubin changed as [`accepted`] says; with
/// `ATLAS_WRITE_ACCEPTED_FIXTURES` set, this writes them.
#[test]
fn accepted_fixtures_are_the_mutants_they_say() {
    let write = std::env::var_os(WRITE_ACCEPTED_ENV).is_some();
    let base = nvcc_cubin();
    for (name, what, bytes) in accepted() {
        let path = accepted_dir().join(name);
        if write {
            std::fs::create_dir_all(accepted_dir()).expect("the fixture directory");
            std::fs::write(&path, &bytes).expect("writing a fixture");
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            committed, bytes,
            "{name} ({what}) is not the mutant it says"
        );
        let changed = (0..base.len()).filter(|&i| base[i] != bytes[i]).count();
        assert!(
            (1..=8).contains(&changed),
            "{name}: {changed} bytes changed"
        );
    }
}

/// Both accepted layouts pass Atlas's checks, for any device and for an H200, and their kernels'
/// parameter layouts are read.
#[test]
fn accepted_layouts_pass() {
    for (name, what, bytes) in accepted() {
        validate_blob(name, &bytes).unwrap_or_else(|e| panic!("{name} ({what}): {e}"));
        validate_blob_for_device(name, &bytes, (9, 0)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let layouts = kernel_layouts(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(layouts.len(), 2, "{name}: axpy and scale");
    }
}

// ---------------------------------------------------------------------------------------------
// The guards
// ---------------------------------------------------------------------------------------------

unsafe extern "C" {
    /// The C library's `memchr`, a reader in C as the driver's is.
    fn memchr(s: *const std::ffi::c_void, c: i32, n: usize) -> *const std::ffi::c_void;
}

/// A child: for each task, has `memchr` read 16 bytes of a blob placed between guards: `inside`
/// it, `past` its end, `before` its start, or at address 16 (`elsewhere`, no guard); answers
/// `read` if it returned.
fn probe_guards() {
    pool::serve(|task| {
        guard::catch_guard_faults();
        let guarded = Guarded::new(
            &[7; 100],
            if task == "before" {
                Place::Start
            } else {
                Place::End
            },
        );
        let start = guarded.bytes().as_ptr();
        let at = match task {
            "inside" => start,
            "past" => start.wrapping_add(90),
            "before" => start.wrapping_sub(8),
            _ => 16 as *const u8,
        };
        // SAFETY: `inside`, 16 bytes of the blob. Otherwise the 16 bytes are not all the blob's,
        // on purpose: `memchr` (looking for a byte the blob lacks) reads into a guard or an
        // unmapped page, and the fault ends this child process before `memchr` returns.
        let found = unsafe { memchr(at.cast(), 1, 16) };
        (
            format!("read {}", std::hint::black_box(found).is_null()),
            true,
        )
    });
}

/// A reader that strays from a blob into a guard ends its process with the exit status of that
/// guard, and a fault elsewhere is the crash it would have been.
#[test]
fn guard_faults_are_told_from_other_crashes() {
    let tasks = ["inside", "past", "before", "elsewhere"].map(String::from);
    let run = pool::run(probe_guards, &[], &tasks, 4, HANG);
    let seen: Vec<Seen> = run.outcomes.iter().map(Seen::of).collect();
    assert_eq!(
        seen[0],
        Seen::Error("read true".into()),
        "{:?}",
        run.outcomes
    );
    assert_eq!(seen[1], Seen::PastEnd, "{:?}", run.outcomes);
    assert_eq!(seen[2], Seen::BeforeStart, "{:?}", run.outcomes);
    assert_eq!(
        seen[3],
        Seen::Crashed("killed by signal 11 (SIGSEGV)".into()),
        "{:?}",
        run.outcomes
    );
}

// ---------------------------------------------------------------------------------------------
// On the GPU
// ---------------------------------------------------------------------------------------------

/// A child: for each task, loads a blob between guards on the plain driver (`sweep INDEX PLACE`,
/// `raw FIXTURE PLACE`) or through Atlas (`atlas FIXTURE PLACE`); answers the driver's status, or
/// `loaded`/`refused`/`error` for Atlas.
fn load_mutants() {
    let rules = rules();
    let mutants = mutants(&rules);
    let accepted = accepted();
    let mut raw: Option<Raw> = None;
    pool::serve(|task| {
        let words: Vec<&str> = task.split_whitespace().collect();
        let [how, index, place] = words[..] else {
            panic!("a task {task:?}");
        };
        let index: usize = index.parse().expect("an index");
        let place = Place::from_word(place).expect("a place");
        let raw =
            raw.get_or_insert_with(|| Raw::new().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}")));
        // Before every load, after the driver's initialisation: whatever handler the driver
        // may have set, this one runs.
        guard::catch_guard_faults();
        let blob = match how {
            "sweep" => &mutants[index].blob,
            _ => &accepted[index].2,
        };
        let guarded = Guarded::new(blob, place);
        if how == "atlas" {
            let blobs: &[(&str, &[u8])] = &[("accepted", guarded.bytes())];
            let answer = match AtlasRegistry::load(0, blobs) {
                Ok(registry) => match registry.function("accepted", "axpy") {
                    Ok(_) => "loaded".to_string(),
                    Err(e) => format!("error {e}"),
                },
                Err(AtlasError::InvalidModule { reason, .. }) => format!("refused {reason}"),
                Err(e) => format!("error {e}"),
            };
            return (answer, raw.usable());
        }
        let code = raw.load_and_unload(guarded.bytes());
        (format!("{code}"), code == 0 || raw.usable())
    });
}

/// What a load of a blob between guards came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Loaded,
    /// A driver error, by its code.
    Error(String),
    /// A read in the guard after the end, or before the start.
    PastEnd,
    BeforeStart,
    /// Any other death: how.
    Crashed(String),
    Hung,
}

impl Seen {
    fn of(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Answered(code) if code == "0" || code == "loaded" => Seen::Loaded,
            Outcome::Answered(code) => Seen::Error(code.clone()),
            Outcome::Crashed(how) if how == &format!("exited with {EXIT_PAST_END}") => {
                Seen::PastEnd
            }
            Outcome::Crashed(how) if how == &format!("exited with {EXIT_BEFORE_START}") => {
                Seen::BeforeStart
            }
            Outcome::Crashed(how) => Seen::Crashed(how.clone()),
            Outcome::Hung => Seen::Hung,
        }
    }

    fn text(&self) -> String {
        match self {
            Seen::Loaded => "loaded".into(),
            Seen::Error(code) => format!("error {}", error_name(code)),
            Seen::PastEnd => "read past the end".into(),
            Seen::BeforeStart => "read before the start".into(),
            Seen::Crashed(how) => format!("crashed ({how})"),
            Seen::Hung => "hung".into(),
        }
    }

    /// How bad it is, to take the worse of a mutant's two loads.
    fn rank(&self) -> u8 {
        match self {
            Seen::Loaded => 0,
            Seen::Error(_) => 1,
            Seen::Hung => 2,
            Seen::Crashed(_) => 3,
            Seen::PastEnd | Seen::BeforeStart => 4,
        }
    }
}

/// `CUDA_ERROR_INVALID_IMAGE` for `200`.
fn error_name(code: &str) -> String {
    code.parse::<u32>().map_or(code.to_string(), |c| {
        let text = atlas_registry::cuda_error_text(c);
        text.split_once(": ")
            .map_or(text.clone(), |(n, _)| n.into())
    })
}

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_structural_rules_against_the_driver() {
    let driver = raw::driver_version().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    let device = atlas_registry::host(0).unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    let rules = rules();
    let mutants = mutants(&rules);
    let tasks: Vec<String> = (0..mutants.len())
        .flat_map(|i| Place::ALL.map(|p| format!("sweep {i} {}", p.word())))
        .collect();
    let run = pool::run(load_mutants, &raw::child_env(), &tasks, jobs(), HANG);
    println!(
        "{} mutants of {} rules, {} loads in {:.1} s, {} child processes; driver {driver}, {}",
        mutants.len(),
        rules.len(),
        tasks.len(),
        run.elapsed.as_secs_f64(),
        run.children,
        device.name()
    );
    // Each mutant: what its load at the end and at the start came to.
    let seen: Vec<[Seen; 2]> = run
        .outcomes
        .chunks_exact(2)
        .map(|pair| [Seen::of(&pair[0]), Seen::of(&pair[1])])
        .collect();
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    let mut verdicts: BTreeMap<usize, String> = BTreeMap::new();
    println!(
        "{:<40} {:<8} {:>7} {:>6} {:>11} {:>7} {:>8} {:>4}  verdict",
        "rule", "class", "mutants", "loaded", "clean error", "crashed", "in guard", "hung"
    );
    for (index, rule) in rules.iter().enumerate() {
        let of: Vec<(&Mutant, &[Seen; 2])> = mutants
            .iter()
            .zip(&seen)
            .filter(|(m, _)| m.rule == index)
            .collect();
        if of.is_empty() {
            continue;
        }
        let worst = |s: &[Seen; 2]| {
            if s[0].rank() >= s[1].rank() {
                s[0].clone()
            } else {
                s[1].clone()
            }
        };
        let count = |pick: fn(&Seen) -> bool| of.iter().filter(|(_, s)| pick(&worst(s))).count();
        let loaded = count(|s| *s == Seen::Loaded);
        let errors = count(|s| matches!(s, Seen::Error(_)));
        let crashed = count(|s| matches!(s, Seen::Crashed(_)));
        let guarded = count(|s| matches!(s, Seen::PastEnd | Seen::BeforeStart));
        let hung = count(|s| *s == Seen::Hung);
        let harm = guarded + crashed + hung > 0;
        // The driver's clean errors, by name.
        let refusals: Vec<String> = of
            .iter()
            .filter_map(|(_, s)| match worst(s) {
                Seen::Error(code) => Some(error_name(&code)),
                _ => None,
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let refusals = if refusals.is_empty() {
            String::new()
        } else {
            format!(" ({})", refusals.join(", "))
        };
        let verdict = match rule.class {
            Class::Accepted | Class::Control => {
                for (m, s) in &of {
                    if s.iter().any(|s| *s != Seen::Loaded) {
                        failures.push(format!(
                            "{} / {} / {}: {} at the end, {} at the start",
                            rule.id,
                            m.source,
                            m.what,
                            s[0].text(),
                            s[1].text()
                        ));
                    }
                }
                if loaded == of.len() {
                    "loads, as expected"
                } else {
                    "DOES NOT LOAD"
                }
                .to_string()
            }
            Class::Relaxed | Class::Foreign if harm => {
                failures.push(format!("{}: blobs Atlas passes crash the driver", rule.id));
                "ATLAS PASSES BLOBS THE DRIVER CRASHES ON".to_string()
            }
            Class::Relaxed | Class::Foreign => format!(
                "passes Atlas; the driver loads {loaded}, refuses {errors} cleanly{refusals}"
            ),
            _ if harm => {
                let why: Vec<&str> = [
                    (guarded > 0, "reads outside the blob"),
                    (crashed > 0, "crashes"),
                    (hung > 0, "hangs"),
                ]
                .iter()
                .filter(|(yes, _)| *yes)
                .map(|(_, why)| *why)
                .collect();
                format!("keep: the driver {}", why.join(", "))
            }
            _ if loaded == of.len() => format!("relax: the driver loads all {loaded}"),
            _ if loaded > 0 => format!(
                "relax: the driver loads {loaded} of {}, refuses the rest cleanly{refusals}",
                of.len()
            ),
            _ => format!("relax: the driver refuses every mutant cleanly{refusals}"),
        };
        // Controls of both forms share an id: one line each.
        let id = if rule.id == "control" {
            format!(
                "control ({})",
                if rule.form == Form::Cubin {
                    "cubins"
                } else {
                    "fatbins"
                }
            )
        } else {
            rule.id.to_string()
        };
        println!(
            "{id:<40} {:<8} {:>7} {loaded:>6} {errors:>11} {crashed:>7} {guarded:>8} {hung:>4}  {verdict}",
            rule.class.word(),
            of.len()
        );
        for (m, s) in &of {
            rows.push(format!(
                "{id}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{verdict}\t{}",
                rule.class.word(),
                m.source,
                m.what,
                m.blob.len(),
                s[0].text(),
                s[1].text(),
                worst(s).text(),
                rule.site
            ));
        }
        verdicts.insert(index, verdict);
    }
    let path = std::env::var_os(VERDICTS_ENV).map_or_else(
        || PathBuf::from("target/structural_verdicts.tsv"),
        PathBuf::from,
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    let mut text = format!(
        "# What the plain driver does with blobs that break one structural rule of Atlas's checks \
         (atlas-registry/tests/structural_rules.rs, gpu_structural_rules_against_the_driver).\n\
         # Driver {driver}, {}. Each blob loaded twice, ending where a PROT_NONE guard begins \
         (end) and starting where one ends (start).\n\
         rule\tclass\tsource\tmutant\tbytes\tend\tstart\tworse\trule verdict\tchecked in\n",
        device.name()
    );
    for row in &rows {
        text.push_str(row);
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!("verdicts written to {}", path.display());
    for failure in &failures {
        println!("FAIL {failure}");
    }
    assert!(
        failures.is_empty(),
        "{} failures: controls or accepted layouts that do not load prove the sweep wrong, a \
         blob Atlas passes that crashes the driver proves Atlas wrong",
        failures.len()
    );
}

/// The two accepted layouts load through Atlas and through the plain driver, each between
/// guards at both places, with no read outside the blob.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_accepted_layouts_load_through_atlas_and_the_plain_driver() {
    let accepted = accepted();
    let tasks: Vec<String> = ["raw", "atlas"]
        .iter()
        .flat_map(|how| {
            (0..accepted.len())
                .flat_map(move |i| Place::ALL.map(|p| format!("{how} {i} {}", p.word())))
        })
        .collect();
    let run = pool::run(load_mutants, &raw::child_env(), &tasks, jobs(), HANG);
    let mut failures = Vec::new();
    for (task, outcome) in tasks.iter().zip(&run.outcomes) {
        let index: usize = task
            .split(' ')
            .nth(1)
            .and_then(|i| i.parse().ok())
            .expect("an index");
        let seen = Seen::of(outcome);
        println!(
            "{} ({task}): {}",
            accepted[index].0,
            match outcome {
                Outcome::Answered(a) if seen != Seen::Loaded => a.clone(),
                _ => seen.text(),
            }
        );
        if seen != Seen::Loaded {
            failures.push(format!("{task}: {outcome:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
