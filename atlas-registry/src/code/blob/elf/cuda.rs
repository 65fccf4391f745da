//! NVIDIA's own parts of a cubin: the `.nv.info` attribute records, the call graph, the toolkit
//! note, the links from a kernel's sections to its symbol and code, relocation types, and the
//! architecture a cubin is built for (`e_flags`, and `.nv.compat` for "a" code: [`cubin_arch`]).
//!
//! What these look like was read from cubins of two toolchains, nvcc 13.0 (the sm_90 cubins once
//! committed) and NVRTC 12.0 (the committed sm_75 to sm_90 ones), and checked against public
//! descriptions of the format. Where the two differ, both are accepted:
//!
//! - One symbol table (`.symtab`), which every symbol index of the cubin refers to. The sections
//!   holding symbol indexes (relocations, `.nv.info*`, `.nv.callgraph`, `.text.<kernel>`) name it
//!   in `sh_link` in nvcc 13's cubins, but name `.nv.info` in NVRTC 12.0's (section 5, whatever
//!   the layout), and the driver loads both: its reader does not follow those links. So every
//!   symbol index is checked against the one symbol table, and a second one is refused.
//! - `.nv.info` (global) and `.nv.info.<kernel>` have type `SHT_CUDA_INFO` (0x7000_0000); for a
//!   kernel's, `sh_info` is its `.text.<kernel>` section (flagged `SHF_INFO_LINK` by nvcc 13, not
//!   by NVRTC 12.0). `.nv.compat` (0x7000_0086, nvcc 13 only) holds records of the same form.
//! - A kernel's constant banks and memory (`.nv.constant0.<kernel>`, `.nv.shared.<kernel>`) name
//!   its code section in `sh_info`, again flagged by nvcc 13 only; so in a cubin the `sh_info` of
//!   every loaded data section (`SHF_ALLOC`, not code) is checked as a section index, flagged or
//!   not.
//! - A record is a 4-byte header, `u8 format, u8 attribute, u16 value-or-size`: format 1 has no
//!   value, 2 a byte and 3 a half word (both in those two bytes), 4 is followed by `size` bytes.
//!   Records start 4-byte aligned.
//! - Attributes whose values the driver follows as indexes: the first word of `REGCOUNT` (0x2f),
//!   `FRAME_SIZE` (0x11), `MIN_STACK_SIZE` (0x12), `MAX_STACK_SIZE` (0x23), `LOAD_CACHE_REQUEST`
//!   (0x26), `SAM_REGION_STACK_SIZE` (0x3b) and `PARAM_CBANK` (0x0a), and every word of `EXTERNS`
//!   (0x0f) and `SYSCALLS_FALLBACK` (0x5d, pairs: a syscall and its fallback), are symbol
//!   indexes; `PARAM_CBANK`'s second word is the parameters' `offset | size << 16` in the
//!   constant bank that symbol's section holds; `KPARAM_INFO` (0x17) is `u32 index, u16 ordinal,
//!   u16 offset, u32 flags` with the size in bits 18–31, and `KPARAM_INFO_V2` (0x45: every
//!   parameter of a kernel whose parameters take more than 4352 bytes, CUDA 12.1 and later)
//!   `u32 index, u16 ordinal, u16 offset, u16 size, u16 flags`; either kind inside the
//!   `CBANK_PARAM_SIZE` (0x19) bytes of parameters, 32764 at most; `EXIT_INSTR_OFFSETS` (0x1c)
//!   are offsets into the kernel's code section. Their records are sized (format 4), as every
//!   toolchain writes them: the driver reads their values whatever the format byte says. Which
//!   words are symbols is how `cuobjdump` 13.2 prints them (by symbol name, failing on an index
//!   past the table); the attribute numbers are its names'.
//! - The toolkit note (`.note.nv.tkinfo`, type 2000, nvcc 13 and NVRTC 13 write one) is six
//!   words, the note's version and the offsets of the object file's name, the tool's name,
//!   version and branch and its options, then those strings; the offsets are the driver's to
//!   follow (see [`check_note`]).
//! - `.nv.callgraph` (`SHT_CUDA_CALLGRAPH`, 0x7000_0001) is pairs of 32-bit values, caller and
//!   callee, with values from 0xffff_fff0 up as markers; callers are symbol indexes, callees not
//!   always (CUDA 11's cuFFT numbers them past the symbol table).
//! - The low 24 bits of a kernel's `.text.<kernel>` `sh_info` are the kernel's symbol; the high 8
//!   hold its register count in NVRTC 12.0's cubins for sm_75 to sm_89, and are 0 otherwise.
//! - Relocations are REL (NVRTC 12.0 before sm_90) or RELA (sm_90, nvcc 13), of R_CUDA types.
//! - The header: `e_version` is the CUDA format version (see `Elf::parse`), and locates
//!   nothing. `EI_ABIVERSION` 7 or 8 says how `e_flags` is laid out ([`sm_arch`]); the driver
//!   indexes its own tables by the SM number there, so that number, and the virtual
//!   architecture's, must be plausible ([`check_flags`]); the flag bits around them are the
//!   driver's to judge, but for bit 31 in version 7 and bit 0 in version 8, which it crashes on.
//! - `JUMPTABLE_RELOCS` (0x03) records are refused: no current toolchain writes one, and the
//!   driver crashes on one whatever its value.

use object::elf::{
    EM_CUDA, SHF_ALLOC, SHF_EXECINSTR, SHN_LORESERVE, SHT_LOPROC, SHT_NOBITS, SHT_PROGBITS,
};

use super::{Elf, MAGIC, Section, Symbols, c_string};
use crate::code::blob::read::{Check, Size, bytes_at, fits, u8_at, u16_at, u32_at, u64_at};
use crate::code::target::{Arch, Features, SM_NUMBERS};

const SHT_CUDA_INFO: u32 = SHT_LOPROC;
const SHT_CUDA_CALLGRAPH: u32 = SHT_LOPROC + 1;
const SHT_CUDA_COMPAT: u32 = SHT_LOPROC + 0x86;
/// The types of the sections of relocatable cubins (`-rdc`) that, like `SHT_NOBITS`, reserve
/// memory and occupy no file bytes: `.nv.global` (0x7000_0007), a kernel's `.nv.shared.K`
/// (0x7000_000a) and `.nv.shared.reserved.0` (0x7000_0015). nvcc 13 puts them at the offset of
/// the next section, and their sizes may run past the end of the file.
const SHT_CUDA_NO_FILE_BYTES: [u32; 3] = [SHT_LOPROC + 7, SHT_LOPROC + 0xa, SHT_LOPROC + 0x15];

/// Whether a cubin's section of type `kind` occupies no file bytes (see
/// [`SHT_CUDA_NO_FILE_BYTES`]).
#[inline]
pub(super) fn occupies_no_file(kind: u32) -> bool {
    SHT_CUDA_NO_FILE_BYTES.contains(&kind)
}

/// Whether a cubin's section of type `kind` holds records that are checked one by one.
#[inline]
pub(super) fn is_record_section(kind: u32) -> bool {
    matches!(kind, SHT_CUDA_INFO | SHT_CUDA_COMPAT | SHT_CUDA_CALLGRAPH)
}

const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;

/// `JUMPTABLE_RELOCS`: no toolchain of CUDA 11 to 13 writes it (none of the 16,807 cubins of
/// NVIDIA's libraries under `/opt/nvlibs` holds one; nvcc 13 describes a switch's jump table with
/// `INDIRECT_BRANCH_TARGETS`, 0x34), and the driver crashes on one, its value as written or
/// zeroed (H200, driver 580: a `KPARAM_INFO` record relabelled 0x03, in cubins of nvcc 13.0,
/// NVRTC 12.0 and cuBLASLt 13.1; `tests/driver_follows.rs`). Refused, in any format.
const EIATTR_JUMPTABLE_RELOCS: u8 = 0x03;
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_EXTERNS: u8 = 0x0f;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_EXIT_INSTR_OFFSETS: u8 = 0x1c;
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;
const EIATTR_MAX_STACK_SIZE: u8 = 0x23;
const EIATTR_LOAD_CACHE_REQUEST: u8 = 0x26;
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_SAM_REGION_STACK_SIZE: u8 = 0x3b;
const EIATTR_SYSCALLS_FALLBACK: u8 = 0x5d;

/// Whether the value of `attribute` holds what the driver follows (symbol indexes, the
/// parameters' place in their bank, instruction offsets), so that its records must be sized
/// (format 4) to hold it: a record of another format has no value there, and the driver reads
/// these attributes' values whatever the format byte says (it crashed on a format-3
/// `SYSCALLS_FALLBACK` record of half word 0x0101). NVIDIA's toolchains write every one of them
/// sized (the 26,296 cubins of the libraries under `/opt/nvlibs`).
#[inline]
fn holds_what_is_followed(attribute: u8) -> bool {
    matches!(
        attribute,
        EIATTR_PARAM_CBANK
            | EIATTR_EXTERNS
            | EIATTR_FRAME_SIZE
            | EIATTR_MIN_STACK_SIZE
            | EIATTR_KPARAM_INFO
            | EIATTR_KPARAM_INFO_V2
            | EIATTR_EXIT_INSTR_OFFSETS
            | EIATTR_MAX_STACK_SIZE
            | EIATTR_LOAD_CACHE_REQUEST
            | EIATTR_REGCOUNT
            | EIATTR_SAM_REGION_STACK_SIZE
            | EIATTR_SYSCALLS_FALLBACK
    )
}

/// The note type of the toolkit information (`.note.nv.tkinfo`).
const NT_CUDA_TKINFO: u32 = 2000;
/// The section of the toolkit information.
pub(super) const TKINFO_SECTION: &str = ".note.nv.tkinfo";
/// The string offsets of a toolkit note, in the order of its words 1 to 5 (word 0 is the note's
/// version); the strings follow the six words.
const TKINFO_STRINGS: [&str; 5] = [
    "object file name",
    "tool name",
    "tool version",
    "tool branch",
    "tool options",
];

/// Call-graph values from here up are markers, not symbols.
const CALLGRAPH_MARKERS: u32 = 0xffff_fff0;

/// `e_ident[EI_ABIVERSION]` of CUDA 12 and older (`ELFABIVERSION_CUDA_V1`): the SM number is the
/// low byte of `e_flags`, the virtual architecture bits 16-23, flags the rest (NVRTC 12.0 writes
/// `0x005a_055a` for sm_90).
const ABI_VERSION_7: u8 = 7;
/// `e_ident[EI_ABIVERSION]` of CUDA 13 for every SM, and of CUDA 12.9 from sm_100
/// (`ELFABIVERSION_CUDA_V2`): the SM number is bits 8-15 of `e_flags`, where version 7 kept flags,
/// the virtual architecture bits 16-23 (0 in CUDA 13's cubins), flags the rest (nvcc 13.0 and
/// NVRTC 13.5 write `0x0600_5a04` for sm_90, `0x0600_6402` for sm_100).
const ABI_VERSION_8: u8 = 8;

/// The bits of `e_flags` that the driver crashes on, swept byte by byte on an H200 (driver 580;
/// `tests/driver_follows.rs`), and that no cubin of NVIDIA's libraries under `/opt/nvlibs` sets.
/// In the layout of ABI version 7, bit 31: every value of the top byte from 0x80 up crashed the
/// driver (NVRTC 12.0's sm_90 cubin), and the 4,263 cubins of that layout have 0 there; no other
/// value of bits 8 to 31 crashed it.
const EF_CRASHING_V1: u32 = 0x8000_0000;
/// In the layout of ABI version 8, bit 0: every odd value of the low byte crashed the driver (the
/// sm_90 cubins of nvcc 13.0 and cuBLASLt 13.1), and the 12,544 cubins of that layout have 0x02 or
/// 0x04 there; no value of bits 16 to 31 crashed it.
const EF_CRASHING_V2: u32 = 0x1;

/// The SM number and the virtual architecture's (0 for none) that `e_flags` of a cubin of ABI
/// version `abi` hold; `None` for an ABI version whose layout is unknown.
fn decode_flags(abi: u8, flags: u32) -> Option<(u32, u32)> {
    let sm = match abi {
        ABI_VERSION_7 => flags & 0xff,
        ABI_VERSION_8 => (flags >> 8) & 0xff,
        _ => return None,
    };
    Some((sm, (flags >> 16) & 0xff))
}

/// The SM architecture an NVIDIA cubin was built for, as its number (90 for sm_90), from its
/// `e_flags`; `None` for anything else (or a cubin of an ABI version other than 7 and 8).
///
/// Two layouts are in use, told apart by `e_ident[EI_ABIVERSION]` (see [`ABI_VERSION_7`] and
/// [`ABI_VERSION_8`]): in version 7 the SM number is the low byte, in version 8 bits 8–15.
pub(crate) fn sm_arch(blob: &[u8]) -> Option<u32> {
    if !blob.starts_with(MAGIC) || u16_at(blob, 18)? != EM_CUDA {
        return None;
    }
    let (sm, _) = decode_flags(u8_at(blob, 8)?, u32_at(blob, 48)?)?;
    (sm != 0).then_some(sm)
}

/// `e_flags`' mark of "a" (architecture-specific) code in the layout of ABI version 7
/// (`EF_CUDA_ACCELERATORS_V1`: CUDA 12's `sm_90a`).
const EF_ARCH_SPECIFIC_V1: u32 = 0x800;
/// `e_flags`' mark of "a" code in the layout of ABI version 8 (`EF_CUDA_ACCELERATORS`: CUDA
/// 12.9's `sm_100a` and `sm_120a`; CUDA 13 leaves it clear).
const EF_ARCH_SPECIFIC_V2: u32 = 0x8;
/// The `.nv.compat` attribute whose byte value 1 marks "a" code in CUDA 13's cubins.
const COMPAT_ARCH_SPECIFIC: u8 = 0x09;

/// The architecture an NVIDIA cubin was built for, with its feature set: [`sm_arch`]'s SM number,
/// "a" ([`Features::Specific`]) when the cubin marks it so, else the baseline. `None` where
/// `sm_arch` has none. Reads only what is there; never fails, on any bytes.
///
/// Where "a" is marked: CUDA 12 sets bit `0x800` of `e_flags` in the layout of ABI version 7
/// (`sm_90a`), CUDA 12.9 bit `0x8` in that of version 8 (`sm_100a`, `sm_120a`); CUDA 13 sets
/// neither (its `sm_90` and `sm_90a` cubins have the same `e_flags`) and writes a `.nv.compat`
/// record of attribute 0x09 with the byte value 1 instead (0 in its other cubins).
///
/// `.nv.compat` (type 0x7000_0086), as nvcc 13.0 writes it for `k.cu` from sm_90 to sm_121f
/// (`tests/fixtures/arch_variants/`): 36 bytes of `.nv.info`-style records, `u8 format, u8
/// attribute, u16 value-or-size`: `02 09 vv 00` (attribute 0x09, byte `vv`: 1 for "a" code, 0
/// else), `02 02 01 00`, `02 05 05 00`, `03 07 01 01` (a half word, 0x0101), `02 03 00 00`,
/// `02 06 01 00`, then `04 0b 08 00` and 8 bytes of value (`09` for sm_100 and sm_100a, `50` for
/// sm_120 and sm_120a, 0 for the others). What the other attributes mean is not known here.
///
/// "f" (family) code is not marked in a cubin (nvcc's sm_100 and sm_100f cubins differ only in
/// the options their toolkit note records, `-arch sm_100f`): only a fatbin entry's flags say
/// "f". A cubin of "f" code is plain SASS of its SM, which runs within its family as "f" code
/// does.
pub(crate) fn cubin_arch(blob: &[u8]) -> Option<Arch> {
    let sm = sm_arch(blob)?;
    let flags = u32_at(blob, 48)?;
    let marked = match u8_at(blob, 8)? {
        ABI_VERSION_7 => flags & EF_ARCH_SPECIFIC_V1 != 0,
        ABI_VERSION_8 => flags & EF_ARCH_SPECIFIC_V2 != 0,
        _ => false,
    } || compat_says_arch_specific(blob);
    let features = if marked {
        Features::Specific
    } else {
        Features::Baseline
    };
    Some(Arch { sm, features })
}

/// Whether a 64-bit ELF file's `.nv.compat` section holds the record of attribute
/// [`COMPAT_ARCH_SPECIFIC`] with the byte value 1. Reads the section table and the records with
/// checked reads, stopping at the first that is not there.
fn compat_says_arch_specific(blob: &[u8]) -> bool {
    const SECTION_HEADER_SIZE: u64 = 64;
    let (Some(2), Some(table), Some(count)) = (u8_at(blob, 4), u64_at(blob, 40), u16_at(blob, 60))
    else {
        return false;
    };
    let compat = (0..u64::from(count)).find_map(|i| {
        let at = table.checked_add(i.checked_mul(SECTION_HEADER_SIZE)?)?;
        let header = bytes_at(blob, at, SECTION_HEADER_SIZE)?;
        (u32_at(header, 4)? == SHT_CUDA_COMPAT)
            .then(|| bytes_at(blob, u64_at(header, 24)?, u64_at(header, 32)?))
            .flatten()
    });
    let Some(mut records) = compat else {
        return false;
    };
    while let Some(&[format, attribute, h0, h1]) = records.first_chunk() {
        if (format, attribute) == (EIFMT_BVAL, COMPAT_ARCH_SPECIFIC) {
            return h0 == 1;
        }
        let size = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => 4,
            EIFMT_SVAL => (4 + usize::from(u16::from_le_bytes([h0, h1])) + 3) & !3,
            _ => return false,
        };
        records = records.get(size..).unwrap_or_default();
    }
    false
}

/// Checks a cubin's `e_flags` (`flags`) for its ABI version `abi`: the SM number is one of
/// [`SM_NUMBERS`], and so is the virtual architecture unless it is 0. The driver indexes its own
/// tables by these numbers (it crashed on SM numbers 255, 144 and 190); every other bit, and the
/// relation between the two numbers, is the driver's to judge. For an ABI version other than 7
/// and 8 the numbers' places are unknown, and nothing is checked.
#[inline]
pub(super) fn check_flags(abi: u8, flags: u32) -> Check {
    let crashing = match abi {
        ABI_VERSION_7 => EF_CRASHING_V1,
        ABI_VERSION_8 => EF_CRASHING_V2,
        _ => 0,
    };
    if flags & crashing != 0 {
        return Err(format!(
            "e_flags {flags:#010x} sets bit {}, which no CUDA toolchain sets in the layout of ABI \
             version {abi} and the driver crashes on",
            crashing.trailing_zeros()
        ));
    }
    let Some((sm, virtual_sm)) = decode_flags(abi, flags) else {
        return Ok(());
    };
    if !SM_NUMBERS.contains(&sm) || (virtual_sm != 0 && !SM_NUMBERS.contains(&virtual_sm)) {
        return Err(flags_refusal(flags, sm, virtual_sm));
    }
    Ok(())
}

/// Why [`check_flags`] refuses `e_flags` `flags`, which name `sm` and `virtual_sm`.
#[cold]
fn flags_refusal(flags: u32, sm: u32, virtual_sm: u32) -> String {
    let (what, number) = if SM_NUMBERS.contains(&sm) {
        ("virtual architecture", virtual_sm)
    } else {
        ("SM", sm)
    };
    format!(
        "e_flags {flags:#010x} names {what} {number}, not an SM number from {} to {} (the driver \
         indexes its tables by it)",
        SM_NUMBERS.start(),
        SM_NUMBERS.end()
    )
}

/// Checks a note of a cubin for what the driver follows in it: a toolkit note (type 2000, or any
/// note in `.note.nv.tkinfo`) is six words, the note's version and the offsets of five strings
/// ([`TKINFO_STRINGS`]), then the strings, and each offset is a string ending in a NUL inside
/// them. The driver reads them: it crashed on tool name offsets 0x9600_0001 and 0x0084_0001. In
/// every toolkit note of the cubins under `/opt/nvlibs` (22,005, of note versions 2 and 127 to
/// 129) they are. `kind` is the note's type, `desc` its description, `in_tkinfo` whether it is
/// in `.note.nv.tkinfo`; other notes hold nothing the driver follows. `Err` says why, to follow
/// "the note at offset N".
#[inline]
pub(super) fn check_note(kind: u32, desc: &[u8], in_tkinfo: bool) -> Result<(), String> {
    if !in_tkinfo && kind != NT_CUDA_TKINFO {
        return Ok(());
    }
    let Some((words, strings)) = desc.split_at_checked(24) else {
        return Err(tkinfo_refusal(desc.len(), None));
    };
    for n in 0..TKINFO_STRINGS.len() {
        let offset = u32_at(words, 4 + 4 * n as u64).unwrap_or(u32::MAX);
        if c_string(strings, offset).is_none() {
            return Err(tkinfo_refusal(desc.len(), Some((n, offset))));
        }
    }
    Ok(())
}

/// Why [`check_note`] refuses a toolkit note of `len` bytes of description: too short, or the
/// offset of string `n` of [`TKINFO_STRINGS`] is `offset`, not a string.
#[cold]
fn tkinfo_refusal(len: usize, string: Option<(usize, u32)>) -> String {
    match string {
        None => format!(
            "is a toolkit note of {len} bytes, shorter than the 24 bytes of its version and \
             string offsets"
        ),
        Some((n, offset)) => format!(
            "is a toolkit note whose {} offset {offset:#x} is not a NUL-terminated string inside \
             its {} bytes of strings",
            TKINFO_STRINGS[n],
            len.saturating_sub(24)
        ),
    }
}

/// Relocation types the driver can know: R_CUDA (below 0x100: 117 are defined by CUDA 13.0, up
/// from about 100 in CUDA 11) and R_MERCURY (0x10000 up, 65 defined). The driver indexes its
/// tables with them.
pub(super) fn is_relocation_type(rtype: u64) -> bool {
    rtype < 0x100 || (0x1_0000..0x1_0100).contains(&rtype)
}

/// How many bytes from a relocation's offset the relocation rewrites, at least, by the highest bit
/// its type writes (for the R_CUDA types as ptxas 13.0 describes them): one byte for the
/// byte-of-an-address types (`R_CUDA_8_0` to `R_CUDA_FUNC_DESC_8_56`, `R_CUDA_UNIFIED_8_*`), 4
/// for the 32-bit ones (`R_CUDA_32`, `R_CUDA_G32`, header indexes, descriptors), 11 to 16 for the
/// fields past bit 63 of a 128-bit instruction (`R_CUDA_ABS47_34`, `R_CUDA_ABS55_16_34`,
/// `R_CUDA_ABS56_16_34`, `R_CUDA_YIELD_CLEAR_PRED4_87`, `R_CUDA_INSTRUCTION128`), none for
/// `R_CUDA_NONE`, and 8 for the rest, which write within an instruction's or an address's first 8
/// bytes. Types after those: 8 in code (instructions are 8 or 16 bytes, relocations point at
/// their start), else 4.
pub(super) fn relocated_bytes(rtype: u64, target: &Section) -> u64 {
    match usize::try_from(rtype)
        .ok()
        .and_then(|t| RELOCATED_BYTES.get(t))
    {
        Some(&bytes) => u64::from(bytes),
        None if target.kind() == SHT_PROGBITS && target.flag(SHF_EXECINSTR) => 8,
        None => 4,
    }
}

/// [`relocated_bytes`] of the R_CUDA types ptxas 13.0 describes (0 to 116), looked up: a
/// relocation's check is one load.
const RELOCATED_BYTES: [u8; 117] = {
    let mut table = [0; 117];
    let mut rtype = 0;
    while rtype < table.len() {
        table[rtype] = match rtype {
            0 | 116 => 0,
            76..=99 | 104..=111 => 1,
            1 | 3 | 6..=9 | 34 | 52 | 70..=72 | 101 | 103 => 4,
            58 | 75 | 114 => 11,
            69 => 12,
            67 => 16,
            _ => 8,
        };
        rtype += 1;
    }
    table
};

/// Checks section `i` of a cubin for what NVIDIA's reader needs beyond generic ELF. `symtab` is
/// the cubin's one symbol table. Called for every section: the checks of loaded data and code
/// are a few comparisons, made here; the sections of records are checked out of line.
#[inline(always)]
pub(super) fn check_section(elf: &Elf<'_>, i: u32, s: &Section, symtab: &Symbols<'_>) -> Check {
    match s.kind() {
        SHT_CUDA_INFO | SHT_CUDA_COMPAT | SHT_CUDA_CALLGRAPH => check_records(elf, i, s, symtab),
        // A kernel's constant banks and memory (`.nv.constant0.K`, `.nv.shared.K`: loaded data)
        // name its code section in `sh_info`; nvcc 13 flags it SHF_INFO_LINK, NVRTC 12.0 does not.
        SHT_PROGBITS | SHT_NOBITS if s.flag(SHF_ALLOC) && !s.flag(SHF_EXECINSTR) => {
            if s.info() >= elf.shnum {
                return Err(section_refusal(elf, i, s, symtab, Fault::DataOwner));
            }
            Ok(())
        }
        SHT_PROGBITS if s.flag(SHF_EXECINSTR) && s.link() != 0 => {
            if u64::from(s.info() & 0x00ff_ffff) >= symtab.count {
                return Err(section_refusal(elf, i, s, symtab, Fault::CodeSymbol));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What can be wrong with a section that [`check_section`] checks itself.
#[derive(Clone, Copy)]
enum Fault {
    /// Loaded data whose `sh_info` is not a section.
    DataOwner,
    /// Code whose `sh_info` names no symbol.
    CodeSymbol,
}

#[cold]
fn section_refusal(
    elf: &Elf<'_>,
    i: u32,
    s: &Section,
    symtab: &Symbols<'_>,
    fault: Fault,
) -> String {
    let why = match fault {
        Fault::DataOwner => format!(
            "sh_info {} (the code section this belongs to) is not one of the {} sections",
            s.info(),
            elf.shnum
        ),
        Fault::CodeSymbol => format!(
            "sh_info {:#x} names symbol {}, past the {} symbols",
            s.info(),
            s.info() & 0x00ff_ffff,
            symtab.count
        ),
    };
    format!("{}: {why}", elf.label(i, s))
}

/// The sections of records and symbol indexes: attributes (`.nv.info*`), compatibility records
/// (`.nv.compat`), the call graph.
fn check_records(elf: &Elf<'_>, i: u32, s: &Section, symtab: &Symbols<'_>) -> Check {
    match s.kind() {
        SHT_CUDA_INFO => check_info(elf, i, s, symtab),
        SHT_CUDA_COMPAT => walk_records(elf.data(i, s)?)
            .map_err(|(at, byte, why)| info_refusal(elf, i, s, symtab, at, byte, why)),
        _ => check_callgraph(elf, i, s, symtab),
    }
}

/// The call graph: pairs of symbol indexes, or markers.
#[inline(never)]
fn check_callgraph(elf: &Elf<'_>, i: u32, s: &Section, symtab: &Symbols<'_>) -> Check {
    let in_section = |e: String| format!("{}: {e}", elf.label(i, s));
    if !matches!(s.entsize(), 0 | 8) || !s.size().is_multiple_of(8) {
        return Err(in_section(format!(
            "entry size {} and size {}: a call graph has whole 8-byte entries",
            s.entsize(),
            s.size()
        )));
    }
    let data = elf.data(i, s)?;
    // Callees are not always symbols: CUDA 11's cuFFT numbers them past the symbol table, in
    // relocatable and executable cubins alike (sm_35 to sm_90), and the driver loads those. The
    // callers are.
    for (n, index) in data.chunks_exact(4).enumerate().step_by(2) {
        let index = u32::from_le_bytes([index[0], index[1], index[2], index[3]]);
        if index < CALLGRAPH_MARKERS && u64::from(index) >= symtab.count {
            return Err(in_section(format!(
                "entry {}: symbol index {index} is past the {} symbols",
                n / 2,
                symtab.count
            )));
        }
    }
    Ok(())
}

/// Reads the attribute records of section bytes `data` (`.nv.compat`'s, which hold nothing the
/// driver follows) to check that each lies inside them: a 4-byte header `u8 format, u8
/// attribute, u16 value-or-size`, a value of `size` bytes for format 4, records 4-byte aligned.
/// A record that does not lie inside the section, or has an unknown format, is an `Err` with its
/// offset, the byte to name (its format or its attribute) and why. `check_info` reads
/// `.nv.info`'s records the same way, with what it checks in them.
fn walk_records(data: &[u8]) -> Result<(), (usize, u8, Why)> {
    let mut next = 0;
    while next < data.len() {
        let at = next;
        let Some(&[format, attribute, h0, h1]) = data.get(at..).and_then(<[u8]>::first_chunk)
        else {
            return Err((at, 0, Why::HeaderPastEnd));
        };
        let half = u16::from_le_bytes([h0, h1]);
        next = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => at + 4,
            EIFMT_SVAL => {
                let end = at + 4 + usize::from(half);
                if end > data.len() {
                    return Err((at, attribute, Why::ValuePastEnd(half)));
                }
                (end + 3) & !3
            }
            _ => return Err((at, format, Why::Format)),
        };
    }
    Ok(())
}

/// A kernel's parameter description (`KPARAM_INFO` or `KPARAM_INFO_V2`), for the refusals made
/// after the last record: the offset and attribute of its record, its ordinal, offset and size.
#[derive(Clone, Copy)]
struct Param {
    at: usize,
    attribute: u8,
    ordinal: u64,
    offset: u64,
    size: u64,
}

impl Param {
    /// The description in a `KPARAM_INFO` or `KPARAM_INFO_V2` (`attribute`) record at `at` whose
    /// value holds `position` and `flags` as its second and third words.
    #[inline(always)]
    fn read(at: usize, attribute: u8, position: u32, flags: u32) -> Self {
        let size = if attribute == EIATTR_KPARAM_INFO {
            flags >> 18
        } else {
            flags & 0xffff
        };
        Self {
            at,
            attribute,
            ordinal: u64::from(position & 0xffff),
            offset: u64::from(position >> 16),
            size: u64::from(size),
        }
    }

    /// Where the parameter ends: 16 bits of offset and at most 16 of size, so no overflow.
    #[inline(always)]
    fn end(&self) -> u64 {
        self.offset + self.size
    }
}

/// The first parameter description of the records `data` (already checked to lie inside them)
/// that `pick` chooses: for a refusal, which names its record.
#[cold]
fn param_where(data: &[u8], pick: impl Fn(&Param) -> bool) -> Option<Param> {
    let mut next = 0;
    while let Some(&[format, attribute, h0, h1]) = data.get(next..).and_then(<[u8]>::first_chunk) {
        let at = next;
        next = at + 4;
        if format != EIFMT_SVAL {
            continue;
        }
        let end = next + usize::from(u16::from_le_bytes([h0, h1]));
        let value = data.get(next..end).unwrap_or_default();
        next = (end + 3) & !3;
        if matches!(attribute, EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2)
            && let (Some(position), Some(flags)) = (word(value, 1), word(value, 2))
        {
            let param = Param::read(at, attribute, position, flags);
            if pick(&param) {
                return Some(param);
            }
        }
    }
    None
}

/// The 32-bit word `n` of a record's value, if it has one.
#[inline(always)]
fn word(value: &[u8], n: usize) -> Option<u32> {
    value
        .get(n.checked_mul(4)?..)?
        .first_chunk()
        .map(|w| u32::from_le_bytes(*w))
}

/// The first of the whole 32-bit words of a record's value that `bad` says is wrong.
#[inline(always)]
fn find_word(value: &[u8], bad: impl Fn(u32) -> bool) -> Option<u32> {
    let mut rest = value;
    while let Some((w, tail)) = rest.split_first_chunk() {
        let w = u32::from_le_bytes(*w);
        if bad(w) {
            return Some(w);
        }
        rest = tail;
    }
    None
}

/// Checks the attribute records of `.nv.info` or a kernel's `.nv.info.K` (section `i`): each lies
/// inside the section, and what the driver follows in them (symbol indexes, the parameters'
/// place in their constant bank, instruction offsets) points inside what it names.
///
/// The loop reads every record of every cubin loaded, so it is written for speed: a record is
/// never built as a value, the parameter descriptions are summed up in three numbers (the one a
/// refusal names is found again on the way out), and every refusal is made by a cold function
/// from plain numbers.
fn check_info(elf: &Elf<'_>, i: u32, s: &Section, symbols: &Symbols<'_>) -> Check {
    let data = elf.data(i, s)?;
    // A kernel's attributes: its code section, when `sh_info` names one.
    let code_size = match s.info() {
        0 => None,
        index => {
            let Some(code) = elf.header(index) else {
                return Err(format!("{}: {}", elf.label(i, s), elf.not_a_section(index)));
            };
            code.flag(SHF_EXECINSTR).then(|| code.size())
        }
    };
    let count = symbols.count;
    let is_symbol = move |index: u32| u64::from(index) < count;
    let refuse = move |at: usize, attribute: u8, why: Why| {
        info_refusal(elf, i, s, symbols, at, attribute, why)
    };
    let mut params = 0u64;
    let mut param_bank = None;
    // The parameter descriptions are checked against the count and the bank size once all
    // records are read: by the highest ordinal, and the furthest end.
    let (mut highest, mut furthest) = (0u64, 0u64);
    // The records as `walk_records` reads them, written out: this loop runs for every record of
    // every cubin loaded.
    let mut next = 0;
    while next < data.len() {
        let record_at = next;
        let Some(&[format, attribute, h0, h1]) =
            data.get(record_at..).and_then(<[u8]>::first_chunk)
        else {
            return Err(refuse(record_at, 0, Why::HeaderPastEnd));
        };
        let half = u16::from_le_bytes([h0, h1]);
        if attribute == EIATTR_JUMPTABLE_RELOCS {
            return Err(refuse(record_at, attribute, Why::Crashes));
        }
        if format != EIFMT_SVAL {
            if !matches!(format, EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL) {
                return Err(refuse(record_at, format, Why::Format));
            }
            if holds_what_is_followed(attribute) {
                return Err(refuse(record_at, attribute, Why::Unsized(format)));
            }
            if attribute == EIATTR_CBANK_PARAM_SIZE && format == EIFMT_HVAL {
                param_bank = Some(u64::from(half));
            }
            next = record_at + 4;
            continue;
        }
        // Inside the section: no overflow.
        let end = record_at + 4 + usize::from(half);
        let Some(value) = data.get(record_at + 4..end) else {
            return Err(refuse(record_at, attribute, Why::ValuePastEnd(half)));
        };
        // `record_at` is 4-byte aligned, so the next record starts after the value's padding.
        next = (end + 3) & !3;
        match attribute {
            EIATTR_REGCOUNT
            | EIATTR_FRAME_SIZE
            | EIATTR_MIN_STACK_SIZE
            | EIATTR_MAX_STACK_SIZE
            | EIATTR_LOAD_CACHE_REQUEST
            | EIATTR_SAM_REGION_STACK_SIZE => match word(value, 0) {
                Some(index) if is_symbol(index) => {}
                Some(index) => return Err(refuse(record_at, attribute, Why::Symbol(index))),
                None => return Err(refuse(record_at, attribute, Why::NoSymbol(value.len()))),
            },
            EIATTR_EXTERNS | EIATTR_SYSCALLS_FALLBACK => {
                if attribute == EIATTR_SYSCALLS_FALLBACK && !value.len().is_multiple_of(8) {
                    return Err(refuse(record_at, attribute, Why::Pairs(value.len())));
                }
                if let Some(index) = find_word(value, |n| !is_symbol(n)) {
                    return Err(refuse(record_at, attribute, Why::Symbol(index)));
                }
            }
            EIATTR_PARAM_CBANK => {
                let index = match word(value, 0) {
                    Some(index) if is_symbol(index) => index,
                    Some(index) => return Err(refuse(record_at, attribute, Why::Symbol(index))),
                    None => return Err(refuse(record_at, attribute, Why::NoSymbol(value.len()))),
                };
                let placement = word(value, 1);
                let Some(placement) = placement else {
                    return Err(refuse(record_at, attribute, Why::NoPlacement));
                };
                let (offset, size) = (u64::from(placement & 0xffff), u64::from(placement >> 16));
                let bank = symbols.get(u64::from(index)).map_or(0, |sym| sym.shndx);
                if bank != 0 && bank < SHN_LORESERVE {
                    let fitting = elf
                        .header(u32::from(bank))
                        .map(|section| fits(offset, size, section.size()));
                    if fitting != Some(true) {
                        return Err(refuse(record_at, attribute, Why::Bank(bank, offset, size)));
                    }
                }
            }
            EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2 => {
                let (Some(position), Some(flags)) = (word(value, 1), word(value, 2)) else {
                    return Err(refuse(record_at, attribute, Why::ShortParam(value.len())));
                };
                params += 1;
                let param = Param::read(record_at, attribute, position, flags);
                highest = highest.max(param.ordinal);
                furthest = furthest.max(param.end());
            }
            EIATTR_EXIT_INSTR_OFFSETS => {
                if let Some(size) = code_size
                    && let Some(offset) = find_word(value, |n| u64::from(n) >= size)
                {
                    return Err(refuse(record_at, attribute, Why::Exit(offset)));
                }
            }
            _ => {}
        }
    }
    if params == 0 {
        return Ok(());
    }
    // The refusals name the first description with the highest ordinal, or the furthest end.
    if highest >= params {
        let (at, attribute) = param_where(data, |p| p.ordinal == highest)
            .map_or((0, EIATTR_KPARAM_INFO), |p| (p.at, p.attribute));
        return Err(refuse(at, attribute, Why::Ordinal(highest, params)));
    }
    if let Some(bank) = param_bank
        && furthest > bank
    {
        let p = param_where(data, |p| p.end() == furthest).unwrap_or(Param {
            at: 0,
            attribute: EIATTR_KPARAM_INFO,
            ordinal: 0,
            offset: furthest,
            size: 0,
        });
        return Err(refuse(p.at, p.attribute, Why::PastParams(p, bank)));
    }
    Ok(())
}

/// Why an attribute record is refused (see `info_refusal`).
#[derive(Clone, Copy)]
enum Why {
    /// Its 4-byte header runs past the end of the section.
    HeaderPastEnd,
    /// Its format (the `attribute` passed along) is unknown.
    Format,
    /// Of this format, not sized, for an attribute whose value the driver follows.
    Unsized(u8),
    /// `SYSCALLS_FALLBACK` of this many bytes, not whole pairs of symbol indexes.
    Pairs(usize),
    /// Its value of this many bytes runs past the end of the section.
    ValuePastEnd(u16),
    /// Not a symbol index of the table.
    Symbol(u32),
    /// A value of this many bytes, too short to hold a symbol index.
    NoSymbol(usize),
    /// `PARAM_CBANK` without the parameters' offset and size.
    NoPlacement,
    /// `PARAM_CBANK`: the parameters at this offset and size do not fit in the bank's section.
    Bank(u16, u64, u64),
    /// `KPARAM_INFO` or `KPARAM_INFO_V2` of this many bytes, too short.
    ShortParam(usize),
    /// An exit instruction at this offset past the end of the code.
    Exit(u32),
    /// A parameter ordinal that is not below the parameter count.
    Ordinal(u64, u64),
    /// A parameter past the end of the kernel's parameter bank of this many bytes.
    PastParams(Param, u64),
    /// An attribute that no toolchain writes and the driver crashes on.
    Crashes,
}

/// The refusal of the record at `at` (attribute `attribute`, or its format for
/// [`Why::Format`]) of attribute section `i`.
#[cold]
fn info_refusal(
    elf: &Elf<'_>,
    i: u32,
    s: &Section,
    symbols: &Symbols<'_>,
    at: usize,
    attribute: u8,
    why: Why,
) -> String {
    let section = elf.label(i, s);
    let len = Size(s.size());
    let record = format!("the attribute record at offset {at} (attribute {attribute:#04x})");
    let e = match why {
        Why::HeaderPastEnd => {
            return format!(
                "{section}: the attribute record at offset {at}: its 4-byte header is past the \
                 end of the {len}-byte section"
            );
        }
        Why::Format => {
            return format!(
                "{section}: the attribute record at offset {at} has format {attribute:#04x}, not \
                 1 (no value), 2 (byte), 3 (half word) or 4 (sized)"
            );
        }
        Why::ValuePastEnd(half) => {
            return format!(
                "{section}: {record}: its {half}-byte value is past the end of the {len}-byte \
                 section"
            );
        }
        Why::Symbol(index) => format!(
            "symbol index {index} is past the {} symbols of {}",
            symbols.count,
            elf.label_of(symbols.index)
        ),
        Why::Unsized(format) => format!(
            "a record of format {format} ({}), but the value of this attribute holds symbol \
             indexes or offsets that the driver follows, which only a sized record (format 4) \
             has room for",
            match format {
                EIFMT_NVAL => "no value",
                EIFMT_BVAL => "a byte",
                _ => "a half word",
            }
        ),
        Why::Pairs(bytes) => {
            format!("{bytes} bytes, not whole pairs of symbol indexes (8 bytes each)")
        }
        Why::NoSymbol(bytes) => format!("{bytes} bytes hold no symbol index"),
        Why::NoPlacement => "no parameter offset and size".into(),
        Why::Bank(bank, offset, size) => match elf.section(u32::from(bank)) {
            Ok(target) => format!(
                "parameters at offset {offset} + size {size} are past the end of {} ({} bytes)",
                elf.label(u32::from(bank), &target),
                Size(target.size())
            ),
            Err(e) => e,
        },
        Why::ShortParam(bytes) => {
            format!("{bytes} bytes, not the 12 of a parameter description")
        }
        Why::Exit(offset) => {
            // Only checked against a code section that `sh_info` names.
            let code = elf.header(s.info()).unwrap_or_default();
            format!(
                "instruction offset {offset} is past the end of {} ({} bytes)",
                elf.label(s.info(), &code),
                Size(code.size())
            )
        }
        Why::Ordinal(ordinal, params) => {
            format!("parameter ordinal {ordinal}, but the kernel has {params} parameters")
        }
        Why::Crashes => "JUMPTABLE_RELOCS, which no CUDA toolchain of the last releases writes \
                         and the driver crashes on"
            .into(),
        Why::PastParams(p, bank) => format!(
            "parameter {} at offset {} + size {} is past the kernel's {bank} bytes of parameters",
            p.ordinal, p.offset, p.size
        ),
    };
    format!("{section}: {record}: {e}")
}
