//! NVIDIA's own parts of a cubin: the `.nv.info` attribute records, the toolkit note, the link
//! from a kernel's data to its code, and the architecture a cubin is built for (`e_flags`, and
//! `.nv.compat` for "a" code: [`cubin_arch`]).
//!
//! What these look like was read from cubins of two toolchains, nvcc 13.0 (the sm_90 cubins once
//! committed) and NVRTC 12.0 (the committed sm_75 to sm_90 ones), and checked against public
//! descriptions of the format. What is checked is only what the driver crashed on, one rule at a
//! time (H200, driver 580: `tests/structural_rules.rs`, the fuzzers' crash fixtures); the rest
//! (symbol indexes in records, the call graph, a kernel's code naming its symbol, the parameters'
//! places, relocation types) the driver loads whatever it holds, or refuses cleanly.
//!
//! - `.nv.info` (global) and `.nv.info.<kernel>` have type `SHT_CUDA_INFO` (0x7000_0000); for a
//!   kernel's, `sh_info` is its `.text.<kernel>` section (flagged `SHF_INFO_LINK` by nvcc 13, not
//!   by NVRTC 12.0), and must be a section. `.nv.compat` (0x7000_0086, nvcc 13 only) holds
//!   records of the same form, which the driver does not read.
//! - A kernel's constant banks and memory (`.nv.constant0.<kernel>`, `.nv.shared.<kernel>`) name
//!   its code section in `sh_info`, again flagged by nvcc 13 only; so in a cubin the `sh_info` of
//!   every loaded data section (`SHF_ALLOC`, not code) is checked as a section index, flagged or
//!   not.
//! - A record is a 4-byte header, `u8 format, u8 attribute, u16 value-or-size`: format 1 has no
//!   value, 2 a byte and 3 a half word (both in those two bytes), 4 is followed by `size` bytes.
//!   Records start 4-byte aligned.
//! - Attributes whose values the driver follows: the first word of `REGCOUNT` (0x2f),
//!   `FRAME_SIZE` (0x11), `MIN_STACK_SIZE` (0x12), `MAX_STACK_SIZE` (0x23), `LOAD_CACHE_REQUEST`
//!   (0x26), `SAM_REGION_STACK_SIZE` (0x3b) and `PARAM_CBANK` (0x0a), and every word of `EXTERNS`
//!   (0x0f) and `SYSCALLS_FALLBACK` (0x5d, pairs: a syscall and its fallback), are symbol
//!   indexes; `PARAM_CBANK`'s second word is the parameters' `offset | size << 16` in the
//!   constant bank that symbol's section holds; `KPARAM_INFO` (0x17) is `u32 index, u16 ordinal,
//!   u16 offset, u32 flags` with the size in bits 18–31, and `KPARAM_INFO_V2` (0x45: every
//!   parameter of a kernel whose parameters take more than 4352 bytes, CUDA 12.1 and later)
//!   `u32 index, u16 ordinal, u16 offset, u16 size, u16 flags`; `EXIT_INSTR_OFFSETS` (0x1c) are
//!   offsets into the kernel's code section. The driver reads their values whatever the format
//!   byte says, and crashed on one stored without a value: their records must be sized (format
//!   4), as every toolchain writes them. Which words are symbols is how `cuobjdump` 13.2 prints
//!   them; the attribute numbers are its names'.
//! - `JUMPTABLE_RELOCS` (0x03) records are refused: no current toolchain writes one, and the
//!   driver crashes on one whatever its value.
//! - The toolkit note (`.note.nv.tkinfo`, type 2000, nvcc 13 and NVRTC 13 write one) is six
//!   words, the note's version and the offsets of the object file's name, the tool's name,
//!   version and branch and its options, then those strings; the offsets are the driver's to
//!   follow (see [`check_note`]).
//! - The header: `EI_ABIVERSION` 7 or 8 says how `e_flags` is laid out ([`sm_arch`]); Atlas
//!   reads the SM number there to choose what a device runs, so that number, and the virtual
//!   architecture's, must be plausible ([`check_flags`]); the flag bits around them are the
//!   driver's to judge, but for bit 31 in version 7 and bit 0 in version 8, which it crashes on.
//!
//! Parameter layouts read from the records ([`crate::code::layout`]) check for themselves what
//! they need of them.

use object::elf::{EM_CUDA, SHF_ALLOC, SHF_EXECINSTR, SHT_LOPROC, SHT_NOBITS, SHT_PROGBITS};

use super::{Elf, MAGIC, Section, c_string};
use crate::code::blob::read::{Check, bytes_at, u8_at, u16_at, u32_at, u64_at};
use crate::code::target::{Arch, Features, SM_NUMBERS};

const SHT_CUDA_INFO: u32 = SHT_LOPROC;
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

/// Whether the records of a cubin's section of type `kind` are read one by one: `.nv.info*`'s.
#[inline]
pub(super) fn is_walked(kind: u32) -> bool {
    kind == SHT_CUDA_INFO
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
/// them. The driver reads them: it crashed on tool name offsets 0x9600_0001 and 0x0084_0001 in
/// `.note.nv.tkinfo`. In every toolkit note of the cubins under `/opt/nvlibs` (22,005, of note
/// versions 2 and 127 to 129) they are. A note of type 2000 elsewhere too short to hold the
/// offsets is not read as one: the driver loads cubins with such a note in `.note.nv.cuinfo`
/// (`tests/structural_rules.rs`, `elf.tkinfo-short`); in `.note.nv.tkinfo` it must hold them.
/// `kind` is the note's type, `desc` its description (as far as its section goes), `in_tkinfo`
/// whether it is in `.note.nv.tkinfo`; other notes hold nothing the driver follows. `Err` says
/// why, to follow "the note at offset N".
#[inline]
pub(super) fn check_note(kind: u32, desc: &[u8], in_tkinfo: bool) -> Result<(), String> {
    if !in_tkinfo && kind != NT_CUDA_TKINFO {
        return Ok(());
    }
    let Some((words, strings)) = desc.split_at_checked(24) else {
        return match in_tkinfo {
            true => Err(tkinfo_refusal(desc.len(), None)),
            false => Ok(()),
        };
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

/// Checks section `i` of a cubin for what NVIDIA's reader needs beyond generic ELF: a kernel's
/// loaded data names its code section, and the records of `.nv.info*`. Called for every section
/// of a type the generic checks leave alone: the check of loaded data is a comparison, made here;
/// the records are checked out of line.
#[inline(always)]
pub(super) fn check_section(elf: &Elf<'_>, i: u32, s: &Section) -> Check {
    match s.kind() {
        SHT_CUDA_INFO => check_info(elf, i, s),
        // A kernel's constant banks and memory (`.nv.constant0.K`, `.nv.shared.K`: loaded data)
        // name its code section in `sh_info`, which the driver follows (it crashed on one past
        // the section table); nvcc 13 flags it SHF_INFO_LINK, NVRTC 12.0 does not.
        SHT_PROGBITS | SHT_NOBITS if s.flag(SHF_ALLOC) && !s.flag(SHF_EXECINSTR) => {
            if s.info() >= elf.shnum {
                return Err(data_owner_refusal(elf, i, s));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cold]
fn data_owner_refusal(elf: &Elf<'_>, i: u32, s: &Section) -> String {
    format!(
        "{}: sh_info {} (the code section this belongs to) is not one of the {} sections",
        elf.label(i, s),
        s.info(),
        elf.shnum
    )
}

/// Checks `.nv.info` or a kernel's `.nv.info.K` (section `i`) for what the driver crashed on:
/// a kernel's `sh_info` that is not a section, a `JUMPTABLE_RELOCS` record, and a record of an
/// attribute whose value the driver follows stored without a value (see
/// [`holds_what_is_followed`]).
///
/// The records are read as far as they can be told apart: a record whose header or value runs
/// past the section, or of an unknown format, ends the walk, since where the next one starts is
/// then unknown (the driver refuses such sections cleanly). What the records hold (symbol
/// indexes, the parameters' places, instruction offsets) is the driver's to judge: it loads
/// cubins with any of them out of range, or refuses them cleanly (`tests/structural_rules.rs`).
/// Parameter layouts read from these records check them for themselves
/// ([`crate::code::layout`]).
fn check_info(elf: &Elf<'_>, i: u32, s: &Section) -> Check {
    let data = elf.data(i, s)?;
    // A kernel's attributes name its code section.
    let index = s.info();
    if index != 0 && elf.header(index).is_none() {
        return Err(format!("{}: {}", elf.label(i, s), elf.not_a_section(index)));
    }
    let mut next = 0;
    while let Some(&[format, attribute, h0, h1]) = data.get(next..).and_then(<[u8]>::first_chunk) {
        let at = next;
        if attribute == EIATTR_JUMPTABLE_RELOCS {
            return Err(info_refusal(elf, i, s, at, attribute, Why::Crashes));
        }
        next = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => {
                if holds_what_is_followed(attribute) {
                    return Err(info_refusal(elf, i, s, at, attribute, Why::Unsized(format)));
                }
                at + 4
            }
            // 4-byte aligned, as `at` is; past the end, the walk ends.
            EIFMT_SVAL => (at + 4 + usize::from(u16::from_le_bytes([h0, h1])) + 3) & !3,
            _ => break,
        };
    }
    Ok(())
}

/// Why an attribute record is refused (see `info_refusal`).
#[derive(Clone, Copy)]
enum Why {
    /// Of this format, not sized, for an attribute whose value the driver follows.
    Unsized(u8),
    /// An attribute that no toolchain writes and the driver crashes on.
    Crashes,
}

/// The refusal of the record at `at` (attribute `attribute`) of attribute section `i`.
#[cold]
fn info_refusal(elf: &Elf<'_>, i: u32, s: &Section, at: usize, attribute: u8, why: Why) -> String {
    let e = match why {
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
        Why::Crashes => "JUMPTABLE_RELOCS, which no CUDA toolchain of the last releases writes \
                         and the driver crashes on"
            .into(),
    };
    format!(
        "{}: the attribute record at offset {at} (attribute {attribute:#04x}): {e}",
        elf.label(i, s)
    )
}
