//! NVIDIA's own parts of a cubin: the `.nv.info` attribute records, the call graph, the links
//! from a kernel's sections to its symbol and code, relocation types, and the SM architecture in
//! `e_flags`.
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
//!   `FRAME_SIZE` (0x11), `MIN_STACK_SIZE` (0x12), `MAX_STACK_SIZE` (0x23) and `PARAM_CBANK`
//!   (0x0a), and every word of `EXTERNS` (0x0f), are symbol indexes; `PARAM_CBANK`'s second word
//!   is the parameters' `offset | size << 16` in the constant bank that symbol's section holds;
//!   `KPARAM_INFO` (0x17) is `u32 index, u16 ordinal, u16 offset, u32 flags` with the size in
//!   bits 18–31, inside `CBANK_PARAM_SIZE` (0x19) bytes; `EXIT_INSTR_OFFSETS` (0x1c) are offsets
//!   into the kernel's code section.
//! - `.nv.callgraph` (`SHT_CUDA_CALLGRAPH`, 0x7000_0001) is pairs of 32-bit symbol indexes, with
//!   values from 0xffff_fff0 up as markers.
//! - The low 24 bits of a kernel's `.text.<kernel>` `sh_info` are the kernel's symbol; the high 8
//!   hold its register count in NVRTC 12.0's cubins for sm_75 to sm_89, and are 0 otherwise.
//! - Relocations are REL (NVRTC 12.0 before sm_90) or RELA (sm_90, nvcc 13), of R_CUDA types.
//! - The header: `e_version` is the CUDA format version (see `Elf::parse`), `EI_ABIVERSION` 7 or
//!   8 says where `e_flags` keeps the SM number ([`sm_arch`]); neither locates anything, so
//!   neither is checked beyond what every ELF file needs.

use object::elf::{
    EM_CUDA, SHF_ALLOC, SHF_EXECINSTR, SHN_LORESERVE, SHT_LOPROC, SHT_NOBITS, SHT_PROGBITS,
};

use super::{Elf, MAGIC, Section};
use crate::blob::read::{Check, Size, bytes_at, fits, u8_at, u16_at, u32_at};

const SHT_CUDA_INFO: u32 = SHT_LOPROC;
const SHT_CUDA_CALLGRAPH: u32 = SHT_LOPROC + 1;
const SHT_CUDA_COMPAT: u32 = SHT_LOPROC + 0x86;

const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;

const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_EXTERNS: u8 = 0x0f;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_EXIT_INSTR_OFFSETS: u8 = 0x1c;
const EIATTR_MAX_STACK_SIZE: u8 = 0x23;
const EIATTR_REGCOUNT: u8 = 0x2f;

/// Call-graph values from here up are markers, not symbols.
const CALLGRAPH_MARKERS: u32 = 0xffff_fff0;

/// `e_ident[EI_ABIVERSION]` from which the SM number is in bits 8–15 of `e_flags` rather than
/// the low byte (LLVM's `ELFABIVERSION_CUDA_V2`; nvcc 13 writes it for every architecture).
const ABI_VERSION_SM_IN_BYTE_1: u8 = 8;

/// The SM architecture an NVIDIA cubin was built for, as its number (90 for sm_90), from its
/// `e_flags`; `None` for anything else (or a cubin of an ABI version after the known ones).
///
/// Two layouts are in use, told apart by `e_ident[EI_ABIVERSION]`: up to version 7
/// (`ELFABIVERSION_CUDA_V1`, CUDA 12 and older) the SM number is the low byte (`EF_CUDA_SM`; NVRTC
/// 12.0 writes `0x005a_055a` for sm_90, the virtual architecture again in bits 16–23), from
/// version 8 it is bits 8–15 (`EF_CUDA_SM_MASK`), where the old layout kept feature flags: nvcc 13
/// writes `0x0600_5a04` for sm_90.
pub(crate) fn sm_arch(blob: &[u8]) -> Option<u32> {
    if !blob.starts_with(MAGIC) || u16_at(blob, 18)? != EM_CUDA {
        return None;
    }
    let flags = u32_at(blob, 48)?;
    let sm = match u8_at(blob, 8)? {
        0..ABI_VERSION_SM_IN_BYTE_1 => flags & 0xff,
        ABI_VERSION_SM_IN_BYTE_1 => (flags >> 8) & 0xff,
        _ => return None,
    };
    (sm != 0).then_some(sm)
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
    match rtype {
        0 | 116 => 0,
        76..=99 | 104..=111 => 1,
        1 | 3 | 6..=9 | 34 | 52 | 70..=72 | 101 | 103 => 4,
        58 | 75 | 114 => 11,
        69 => 12,
        67 => 16,
        2..=115 => 8,
        _ if target.kind == SHT_PROGBITS && target.flag(SHF_EXECINSTR) => 8,
        _ => 4,
    }
}

/// Checks section `i` of a cubin for what NVIDIA's reader needs beyond generic ELF. `symtab` is
/// the cubin's one symbol table.
pub(super) fn check_section(elf: &Elf<'_>, i: u32, s: &Section, symtab: u32) -> Check {
    let in_section = |e: String| format!("{}: {e}", elf.label(i, s));
    match s.kind {
        SHT_CUDA_INFO => check_info(elf, i, s, symtab),
        SHT_CUDA_COMPAT => {
            for record in Records::new(elf.data(i, s)?) {
                record.map_err(in_section)?;
            }
            Ok(())
        }
        SHT_CUDA_CALLGRAPH => {
            if !matches!(s.entsize, 0 | 8) || !s.size.is_multiple_of(8) {
                return Err(in_section(format!(
                    "entry size {} and size {}: a call graph has whole 8-byte entries",
                    s.entsize, s.size
                )));
            }
            let symbols = elf.symbols_of(i, s, symtab)?;
            let data = elf.data(i, s)?;
            for n in 0..s.size / 4 {
                let index = u32_at(data, n * 4).unwrap_or(0);
                if index < CALLGRAPH_MARKERS && u64::from(index) >= symbols.count {
                    return Err(in_section(format!(
                        "entry {}: symbol index {index} is past the {} symbols",
                        n / 2,
                        symbols.count
                    )));
                }
            }
            Ok(())
        }
        // A kernel's constant banks and memory (`.nv.constant0.K`, `.nv.shared.K`: loaded data)
        // name its code section in `sh_info`; nvcc 13 flags it SHF_INFO_LINK, NVRTC 12.0 does not.
        SHT_PROGBITS | SHT_NOBITS if s.flag(SHF_ALLOC) && !s.flag(SHF_EXECINSTR) => {
            if s.info >= elf.shnum {
                return Err(in_section(format!(
                    "sh_info {} (the code section this belongs to) is not one of the {} sections",
                    s.info, elf.shnum
                )));
            }
            Ok(())
        }
        SHT_PROGBITS if s.flag(SHF_EXECINSTR) && s.link != 0 => {
            let symbols = elf.symbols_of(i, s, symtab)?;
            let symbol = s.info & 0x00ff_ffff;
            if u64::from(symbol) >= symbols.count {
                return Err(in_section(format!(
                    "sh_info {:#x} names symbol {symbol}, past the {} symbols",
                    s.info, symbols.count
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An attribute record of `.nv.info` or `.nv.compat`.
#[derive(Debug, Clone, Copy)]
struct Record<'a> {
    at: u64,
    format: u8,
    attribute: u8,
    /// The value of formats 2 and 3; the size of format 4's.
    half: u16,
    /// Format 4's value; empty for the others.
    value: &'a [u8],
}

impl Record<'_> {
    /// The `n`th 32-bit word of the value, if it has one.
    fn word(&self, n: u64) -> Option<u32> {
        u32_at(self.value, n.checked_mul(4)?)
    }

    fn words(&self) -> u64 {
        self.value.len() as u64 / 4
    }
}

/// The records of a section's bytes, each checked to lie inside them; stops at the first bad one.
struct Records<'a> {
    data: &'a [u8],
    at: u64,
}

impl<'a> Records<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0 }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Check<Record<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let len = self.data.len() as u64;
        let at = self.at;
        if at >= len {
            return None;
        }
        // Whatever happens, this is the last record unless it is well formed.
        self.at = len;
        let Some(&[format, attribute, h0, h1]) = bytes_at(self.data, at, 4) else {
            return Some(Err(format!(
                "the attribute record at offset {at}: its 4-byte header is past the end of the \
                 {}-byte section",
                Size(len)
            )));
        };
        let half = u16::from_le_bytes([h0, h1]);
        let value: &[u8] = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => &[],
            EIFMT_SVAL => match bytes_at(self.data, at + 4, u64::from(half)) {
                Some(value) => value,
                None => {
                    return Some(Err(format!(
                        "the attribute record at offset {at} (attribute {attribute:#04x}): its \
                         {half}-byte value is past the end of the {}-byte section",
                        Size(len)
                    )));
                }
            },
            _ => {
                return Some(Err(format!(
                    "the attribute record at offset {at} has format {format:#04x}, not 1 (no \
                     value), 2 (byte), 3 (half word) or 4 (sized)"
                )));
            }
        };
        // Within the section, so no overflow; the next record starts 4-byte aligned.
        self.at = (at + 4 + value.len() as u64 + 3) & !3;
        Some(Ok(Record {
            at,
            format,
            attribute,
            half,
            value,
        }))
    }
}

fn check_info(elf: &Elf<'_>, i: u32, s: &Section, symtab: u32) -> Check {
    let in_section = |e: String| format!("{}: {e}", elf.label(i, s));
    let data = elf.data(i, s)?;
    let symbols = elf.symbols_of(i, s, symtab)?;
    // A kernel's attributes: its code section, when `sh_info` names one.
    let code = match s.info {
        0 => None,
        index => Some(elf.section(index).map_err(in_section)?),
    };
    let about = |record: Record<'_>, e: String| {
        in_section(format!(
            "the attribute record at offset {} (attribute {:#04x}): {e}",
            record.at, record.attribute
        ))
    };
    let mut params = 0u64;
    let mut param_bank = None;
    // The parameter descriptions are checked against the count and the bank size once all
    // records are read: the highest ordinal, and the parameter that ends furthest.
    let mut highest: Option<(Record<'_>, u64)> = None;
    let mut furthest: Option<(Record<'_>, u64, u64, u64)> = None;
    for record in Records::new(data) {
        let record = record.map_err(in_section)?;
        if record.attribute == EIATTR_CBANK_PARAM_SIZE && record.format == EIFMT_HVAL {
            param_bank = Some(u64::from(record.half));
        }
        if record.format != EIFMT_SVAL {
            continue;
        }
        let what = |e: String| about(record, e);
        let symbol = |n: u64| -> Check<u64> {
            let index = record.word(n).ok_or_else(|| {
                what(format!("{} bytes hold no symbol index", record.value.len()))
            })?;
            if u64::from(index) >= symbols.count {
                return Err(what(format!(
                    "symbol index {index} is past the {} symbols of {}",
                    symbols.count,
                    elf.label_of(symbols.index)
                )));
            }
            Ok(u64::from(index))
        };
        match record.attribute {
            EIATTR_REGCOUNT | EIATTR_FRAME_SIZE | EIATTR_MIN_STACK_SIZE | EIATTR_MAX_STACK_SIZE => {
                symbol(0)?;
            }
            EIATTR_EXTERNS => {
                for n in 0..record.words() {
                    symbol(n)?;
                }
            }
            EIATTR_PARAM_CBANK => {
                let bank = symbols.get(symbol(0)?).map(|sym| sym.shndx);
                let placement = record
                    .word(1)
                    .ok_or_else(|| what("no parameter offset and size".into()))?;
                let (offset, size) = (u64::from(placement & 0xffff), u64::from(placement >> 16));
                if let Some(index) = bank
                    && index != 0
                    && index < SHN_LORESERVE
                {
                    let index = u32::from(index);
                    let section = elf.section(index).map_err(what)?;
                    if !fits(offset, size, section.size) {
                        return Err(what(format!(
                            "parameters at offset {offset} + size {size} are past the end of {} \
                             ({} bytes)",
                            elf.label(index, &section),
                            Size(section.size)
                        )));
                    }
                }
            }
            EIATTR_KPARAM_INFO => {
                let (Some(flags), Some(position)) = (record.word(2), record.word(1)) else {
                    return Err(what(format!(
                        "{} bytes, not the 12 of a parameter description",
                        record.value.len()
                    )));
                };
                params += 1;
                let (ordinal, offset) = (u64::from(position & 0xffff), u64::from(position >> 16));
                let size = u64::from(flags >> 18);
                if highest.is_none_or(|(_, o)| ordinal > o) {
                    highest = Some((record, ordinal));
                }
                let end = offset.saturating_add(size);
                if furthest.is_none_or(|(_, _, o, s)| end > o.saturating_add(s)) {
                    furthest = Some((record, ordinal, offset, size));
                }
            }
            EIATTR_EXIT_INSTR_OFFSETS => {
                if let Some(code) = code.filter(|c| c.flag(SHF_EXECINSTR)) {
                    for n in 0..record.words() {
                        let offset = u64::from(record.word(n).unwrap_or(0));
                        if offset >= code.size {
                            return Err(what(format!(
                                "instruction offset {offset} is past the end of {} ({} bytes)",
                                elf.label(s.info, &code),
                                Size(code.size)
                            )));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if let Some((record, ordinal)) = highest
        && ordinal >= params
    {
        return Err(about(
            record,
            format!("parameter ordinal {ordinal}, but the kernel has {params} parameters"),
        ));
    }
    if let (Some((record, ordinal, offset, size)), Some(bank)) = (furthest, param_bank)
        && !fits(offset, size, bank)
    {
        return Err(about(
            record,
            format!(
                "parameter {ordinal} at offset {offset} + size {size} is past the kernel's \
                 {bank} bytes of parameters"
            ),
        ));
    }
    Ok(())
}
