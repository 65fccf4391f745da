//! ELF images: the structure that every reader of one walks, checked before the driver walks it.
//!
//! The driver's ELF reader trusts what it reads: a section header whose name, offset, size, link
//! or info points elsewhere, a symbol or relocation naming a section or symbol that does not exist,
//! crashes the process inside `cuModuleLoadData` (measured on an H200 with single-byte changes to
//! real cubins). So every offset, size and index that a reader follows is checked here first:
//!
//! - the header: 64-bit, little-endian, ELF identification version 1, a GPU machine, a known file
//!   type, and the header and table entry sizes of ELF64 (the object file version `e_version`
//!   varies with the CUDA toolkit, see `Elf::parse`);
//! - the program header table and the section header table lie inside the image (after the ELF
//!   header), and so does every segment's file image and every section's bytes (except `NOBITS`);
//! - the section name table exists and ends in a NUL, and every section name starts inside it;
//!   every string table ends in a NUL, so every name in one is terminated inside it;
//! - every `sh_link` is a section, and names a section of the right type where the type of the
//!   section says what it links to (symbol table → string table; relocations, hash tables,
//!   groups → symbol table; dynamic section → string table; in a cubin, symbol indexes refer to
//!   its one symbol table whatever `sh_link` says, see [`cuda`]); an `sh_info` flagged as a
//!   section index (`SHF_INFO_LINK`) is 0 or a section;
//! - symbol tables have 24-byte entries, each name inside the string table and each section index
//!   a section (or undefined, absolute, common);
//! - relocations have 16- or 24-byte entries, each naming a symbol of the linked table, and,
//!   where offsets are section offsets (cubins, relocatable files), an offset inside the section
//!   that `sh_info` names (in a cubin, with every byte its type rewrites);
//! - notes lie inside their section (and a cubin's toolkit note's strings inside it, see
//!   [`cuda`]).
//!
//! NVIDIA's own sections of a cubin are checked in [`cuda`]. What is not checked: instruction
//! bytes, and the meaning of values that are not offsets, sizes or indexes.
//!
//! The numbers of the ELF standard come from `object::elf`. The reading is our own: `object`'s
//! readers cast the image to its header types, which needs the image aligned for them (its
//! `unaligned` feature is off), while blobs come from `include_bytes!` and from inside fatbins and
//! bundles at any address; and a refusal here must say which section and which field is wrong.
//! It is the crate's one ELF reader: parameter layouts ([`crate::code::layout`]) read cubins
//! through [`Elf`] too.

pub(super) mod cuda;
pub(super) mod extent;

use std::borrow::Cow;

use object::elf::{
    ELFCLASS64, ELFCOMPRESS_ZLIB, ELFCOMPRESS_ZSTD, ELFDATA2LSB, EM_AMDGPU, EM_CUDA, ET_DYN,
    ET_EXEC, ET_REL, EV_CURRENT, SHF_COMPRESSED, SHF_INFO_LINK, SHN_ABS, SHN_COMMON, SHN_HIPROC,
    SHN_LOPROC, SHN_LORESERVE, SHN_UNDEF, SHN_XINDEX, SHT_DYNAMIC, SHT_DYNSYM, SHT_GNU_HASH,
    SHT_GNU_VERSYM, SHT_GROUP, SHT_HASH, SHT_NOBITS, SHT_NOTE, SHT_NULL, SHT_REL, SHT_RELA,
    SHT_STRTAB, SHT_SYMTAB, SHT_SYMTAB_SHNDX, STB_LOOS, STB_WEAK, STT_FUNC, STT_LOOS, STT_OBJECT,
    STT_TLS,
};

use super::read::{
    Check, InOrder, Scanned, Size, bytes_at, field, fits, overlapping, past_end, u8_at, u16_at,
    u32_at, u64_at,
};

/// The first bytes of every ELF file.
pub(super) const MAGIC: &[u8] = b"\x7fELF";

const HEADER_SIZE: u64 = 64;
const PROGRAM_HEADER_SIZE: u64 = 56;
const SECTION_HEADER_SIZE: u64 = 64;
const SYMBOL_SIZE: u64 = 24;
const REL_SIZE: u64 = 16;
const RELA_SIZE: u64 = 24;
/// `e_phnum` meaning "more than fit here": extended numbering, which GPU code never needs.
const PN_XNUM: u16 = 0xffff;

/// Which machines an ELF image may be built for, where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::code) enum Machines {
    /// A module blob or a clang offload-bundle entry: an NVIDIA cubin (`EM_CUDA`) or an AMD GPU
    /// code object (`EM_AMDGPU`, for the SCALE/HIP toolchain).
    Gpu,
    /// An entry of an NVIDIA fatbin: a cubin only.
    Cuda,
}

/// Checks the ELF image `b`, which is the `whole` ("blob", "ELF payload") named in refusals.
pub(in crate::code) fn check(b: &[u8], whole: &str, machines: Machines) -> Check {
    let elf = Elf::parse(b, whole, machines)?;
    if elf.cuda {
        // Inside the header (checked by `parse`).
        cuda::check_flags(u8_at(b, 8).unwrap_or(0), u32_at(b, 48).unwrap_or(0))?;
    }
    elf.check_program_headers()?;
    elf.check_sections()
}

/// Whether `b` is an ELF file for a GPU: an NVIDIA cubin or an AMD GPU code object.
pub(super) fn is_gpu_elf(b: &[u8]) -> bool {
    b.starts_with(MAGIC) && matches!(u16_at(b, 18), Some(EM_CUDA | EM_AMDGPU))
}

/// A section header: its 64 bytes in the image, each field read where it is used (a check
/// that follows one link reads one or two fields of the section it reaches).
#[derive(Debug, Clone, Copy)]
pub(in crate::code) struct Section<'a> {
    h: &'a [u8; SECTION_HEADER_SIZE as usize],
}

impl Default for Section<'_> {
    /// The null section's header, all zeros.
    fn default() -> Self {
        Self {
            h: &[0; SECTION_HEADER_SIZE as usize],
        }
    }
}

impl<'a> Section<'a> {
    #[inline(always)]
    fn read(h: &'a [u8; SECTION_HEADER_SIZE as usize]) -> Self {
        Self { h }
    }

    #[inline(always)]
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(field(self.h, at))
    }

    #[inline(always)]
    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(field(self.h, at))
    }

    /// `sh_name`: the offset of its name in the section name table.
    #[inline(always)]
    fn name(&self) -> u32 {
        self.u32(0)
    }

    /// `sh_type`.
    #[inline(always)]
    pub(in crate::code) fn kind(&self) -> u32 {
        self.u32(4)
    }

    /// `sh_flags`.
    #[inline(always)]
    fn flags(&self) -> u64 {
        self.u64(8)
    }

    /// `sh_offset`.
    #[inline(always)]
    fn offset(&self) -> u64 {
        self.u64(24)
    }

    /// `sh_size`.
    #[inline(always)]
    fn size(&self) -> u64 {
        self.u64(32)
    }

    /// `sh_link`.
    #[inline(always)]
    fn link(&self) -> u32 {
        self.u32(40)
    }

    /// `sh_info`.
    #[inline(always)]
    pub(in crate::code) fn info(&self) -> u32 {
        self.u32(44)
    }

    /// `sh_addralign`.
    #[inline(always)]
    fn align(&self) -> u64 {
        self.u64(48)
    }

    /// `sh_entsize`.
    #[inline(always)]
    fn entsize(&self) -> u64 {
        self.u64(56)
    }

    #[inline(always)]
    fn flag(&self, flag: u32) -> bool {
        self.flags() & u64::from(flag) != 0
    }
}

/// A symbol table, checked for shape (type, entry size, bytes inside the image).
#[derive(Debug, Clone, Copy)]
pub(in crate::code) struct Symbols<'a> {
    index: u32,
    data: &'a [u8],
    count: u64,
}

/// A symbol, as read.
#[derive(Debug, Clone, Copy)]
pub(in crate::code) struct Symbol {
    /// `st_name`: the offset of its name in the string table.
    pub(in crate::code) name: u32,
    /// `STB_*`, the high nibble of `st_info`.
    binding: u8,
    /// `STT_*`, the low nibble of `st_info`.
    pub(in crate::code) kind: u8,
    /// `st_other`.
    pub(in crate::code) other: u8,
    /// `st_shndx`.
    pub(in crate::code) shndx: u16,
    value: u64,
    size: u64,
}

impl Symbols<'_> {
    #[inline]
    fn get(&self, n: u64) -> Option<Symbol> {
        let at = usize::try_from(n.checked_mul(SYMBOL_SIZE)?).ok()?;
        self.data.get(at..)?.first_chunk().map(Symbol::read)
    }

    /// Every symbol of the table, in order.
    pub(in crate::code) fn iter(&self) -> impl Iterator<Item = Symbol> + '_ {
        self.data
            .chunks_exact(SYMBOL_SIZE as usize)
            .filter_map(|entry| entry.first_chunk().map(Symbol::read))
    }
}

impl Symbol {
    /// A symbol from its 24 bytes.
    #[inline]
    fn read(entry: &[u8; SYMBOL_SIZE as usize]) -> Self {
        let ([info], [other]) = (field(entry, 4), field(entry, 5));
        Self {
            name: u32::from_le_bytes(field(entry, 0)),
            binding: info >> 4,
            kind: info & 0xf,
            other,
            shndx: u16::from_le_bytes(field(entry, 6)),
            value: u64::from_le_bytes(field(entry, 8)),
            size: u64::from_le_bytes(field(entry, 16)),
        }
    }
}

/// What can be wrong with a symbol (see `Elf::symbol_fault`).
#[derive(Debug, Clone, Copy)]
enum SymbolFault {
    /// Its name is not in the string table.
    Name,
    /// Its binding or type is reserved.
    Reserved,
    /// `SHN_XINDEX`.
    ExtendedIndex,
    /// Its section index is not a section.
    NoSection,
    /// Its value and size run past the end of its section.
    PastSection,
    /// Its section index is in the reserved range.
    ReservedIndex,
}

/// An ELF image whose header, section header table and section name table have been checked:
/// what every reader needs to find anything in it, and the reader of parameter layouts uses too.
pub(in crate::code) struct Elf<'a> {
    b: &'a [u8],
    whole: &'a str,
    cuda: bool,
    file_type: u16,
    phoff: u64,
    phnum: u16,
    /// The section header table: `shnum` headers of 64 bytes.
    headers: &'a [u8],
    shnum: u32,
    /// The bytes of the section name table, ending in a NUL.
    names: &'a [u8],
}

impl<'a> Elf<'a> {
    /// Reads the header, the section header table and the section name table of `b`, which is the
    /// `whole` ("blob", "ELF payload") named in refusals.
    pub(in crate::code) fn parse(b: &'a [u8], whole: &'a str, machines: Machines) -> Check<Self> {
        let len = b.len() as u64;
        if len < HEADER_SIZE {
            return Err(format!(
                "truncated ELF: {} bytes, shorter than its 64-byte header",
                Size(len)
            ));
        }
        // The 64 header bytes are there (checked above): these reads all succeed.
        let byte = |at| u8_at(b, at).unwrap_or(0);
        let half = |at| u16_at(b, at).unwrap_or(0);
        let word = |at| u64_at(b, at).unwrap_or(0);
        if byte(4) != ELFCLASS64 {
            return Err(format!(
                "not a 64-bit ELF file (EI_CLASS {}), as GPU code objects are",
                byte(4)
            ));
        }
        if byte(5) != ELFDATA2LSB {
            return Err(format!(
                "not a little-endian ELF file (EI_DATA {}), as GPU code objects are",
                byte(5)
            ));
        }
        // EI_VERSION is the version of the ELF format itself, which every reader relies on.
        if byte(6) != EV_CURRENT {
            return Err(format!(
                "ELF identification version {} (EI_VERSION), not {EV_CURRENT}",
                byte(6)
            ));
        }
        let machine = half(18);
        let cuda = match (machine, machines) {
            (EM_CUDA, _) => true,
            (EM_AMDGPU, Machines::Gpu) => false,
            (EM_AMDGPU, Machines::Cuda) => {
                return Err(format!(
                    "an ELF file for machine {EM_AMDGPU} (AMD GPU) inside an NVIDIA fatbin"
                ));
            }
            (other, Machines::Gpu) => {
                return Err(format!(
                    "an ELF file for machine {other}, not CUDA ({EM_CUDA}) or AMD GPU ({EM_AMDGPU})"
                ));
            }
            (other, Machines::Cuda) => {
                return Err(format!(
                    "an ELF file for machine {other}, not CUDA ({EM_CUDA})"
                ));
            }
        };
        // e_version is the object file's version: 1 (EV_CURRENT) in AMD code objects and nvcc 13
        // cubins, but other CUDA toolchains write the toolkit's version there as
        // `10 * major + minor` (NVRTC 12.0: 120, nvJitLink 12.8: 128). No reader locates anything
        // by it, so it is not checked; nor are `e_flags` here (see `cuda::check_flags`).
        let file_type = half(16);
        if !matches!(file_type, ET_REL | ET_EXEC | ET_DYN) {
            return Err(format!(
                "ELF file type {file_type} is not relocatable ({ET_REL}), executable ({ET_EXEC}) \
                 or shared ({ET_DYN})"
            ));
        }
        if u64::from(half(52)) != HEADER_SIZE {
            return Err(format!(
                "e_ehsize is {}, not the {HEADER_SIZE} bytes of an ELF64 header",
                half(52)
            ));
        }

        let (phoff, phnum) = (word(32), half(56));
        if phnum > 0 {
            if phnum == PN_XNUM {
                return Err(
                    "extended program header numbering (e_phnum 0xffff) is not supported".into(),
                );
            }
            if u64::from(half(54)) != PROGRAM_HEADER_SIZE {
                return Err(format!(
                    "e_phentsize is {}, not the {PROGRAM_HEADER_SIZE} bytes of an ELF64 program header",
                    half(54)
                ));
            }
        }

        let (shoff, shnum, shstrndx) = (word(40), half(60), half(62));
        if shnum == 0 {
            if shoff != 0 {
                return Err(format!(
                    "extended section numbering (e_shnum 0, e_shoff {shoff}) is not supported"
                ));
            }
            if cuda {
                return Err("a CUDA cubin without a section header table".into());
            }
            return Ok(Self {
                b,
                whole,
                cuda,
                file_type,
                phoff,
                phnum,
                headers: &[],
                shnum: 0,
                names: &[],
            });
        }
        if shnum >= SHN_LORESERVE {
            return Err(format!(
                "e_shnum {shnum} is in the reserved range (0xff00 and above)"
            ));
        }
        if u64::from(half(58)) != SECTION_HEADER_SIZE {
            return Err(format!(
                "e_shentsize is {}, not the {SECTION_HEADER_SIZE} bytes of an ELF64 section header",
                half(58)
            ));
        }
        check_table(
            "section header table",
            shoff,
            shnum,
            SECTION_HEADER_SIZE,
            b,
            whole,
        )?;
        let mut elf = Self {
            b,
            whole,
            cuda,
            file_type,
            phoff,
            phnum,
            // Inside the image (checked above).
            headers: bytes_at(b, shoff, u64::from(shnum) * SECTION_HEADER_SIZE).unwrap_or_default(),
            shnum: u32::from(shnum),
            names: &[],
        };
        if shstrndx == SHN_UNDEF || shstrndx >= shnum {
            return Err(format!(
                "e_shstrndx {shstrndx} is not one of the {shnum} sections: no section name table"
            ));
        }
        let index = u32::from(shstrndx);
        let table = elf.section(index)?;
        let what = || format!("section {index} (the section name table, e_shstrndx)");
        if table.kind() != SHT_STRTAB {
            return Err(format!(
                "{}: type {:#x}, not a string table",
                what(),
                table.kind()
            ));
        }
        let names = bytes_at(b, table.offset(), table.size())
            .ok_or_else(|| past_end(&what(), table.offset(), table.size(), b.len(), whole))?;
        if names.last() != Some(&0) {
            return Err(format!("{}: does not end with a NUL byte", what()));
        }
        elf.names = names;
        Ok(elf)
    }

    /// Sections 1 and up, with their indexes.
    pub(in crate::code) fn sections(&self) -> impl Iterator<Item = (u32, Section<'a>)> + '_ {
        (1..self.shnum).filter_map(|i| Some((i, self.header(i)?)))
    }

    /// The name of section `i`, `s`: the bytes before its NUL in the section name table (which
    /// ends in one, checked by `parse`).
    pub(in crate::code) fn section_name(&self, i: u32, s: &Section) -> Check<&'a [u8]> {
        c_string(self.names, s.name()).ok_or_else(|| {
            format!(
                "section {i}: its name offset {} is outside the {}-byte section name table",
                s.name(),
                Size(self.names.len() as u64)
            )
        })
    }

    /// The first symbol table (`SHT_SYMTAB`) and its string table, `None` when there is none.
    pub(in crate::code) fn symbol_table(&self) -> Check<Option<(Symbols<'a>, &'a [u8])>> {
        let Some((i, s)) = self.sections().find(|(_, s)| s.kind() == SHT_SYMTAB) else {
            return Ok(None);
        };
        let symbols = self.symbols(i, &s, i)?;
        Ok(Some((symbols, self.strings(i, &s, s.link())?)))
    }

    /// Section header `i`, `None` when it is not one of the table's.
    #[inline]
    fn header(&self, i: u32) -> Option<Section<'a>> {
        let at = usize::try_from(i)
            .ok()?
            .checked_mul(SECTION_HEADER_SIZE as usize)?;
        self.headers.get(at..)?.first_chunk().map(Section::read)
    }

    /// Section header `i`, which must be one of the table's (else a refusal).
    #[inline]
    fn section(&self, i: u32) -> Check<Section<'a>> {
        self.header(i).ok_or_else(|| self.not_a_section(i))
    }

    #[cold]
    fn not_a_section(&self, i: u32) -> String {
        format!(
            "section index {i} is not one of the {} sections",
            self.shnum
        )
    }

    /// A section's name, for refusals; a name offset outside the name table reads as empty.
    fn name(&self, s: &Section) -> Cow<'a, str> {
        let tail = usize::try_from(s.name())
            .ok()
            .and_then(|at| self.names.get(at..))
            .unwrap_or_default();
        let end = tail.iter().position(|&c| c == 0).unwrap_or(tail.len());
        String::from_utf8_lossy(tail.get(..end).unwrap_or_default())
    }

    /// `section 12 (.nv.info.scale)`, for refusals.
    fn label(&self, i: u32, s: &Section) -> String {
        format!("section {i} ({})", self.name(s))
    }

    /// `section 12 (.nv.info.scale)` for a section known only by its index.
    fn label_of(&self, i: u32) -> String {
        match self.section(i) {
            Ok(s) => self.label(i, &s),
            Err(_) => format!("section {i}"),
        }
    }

    /// The bytes of section `i`: empty for `NOBITS` and null sections, a refusal when they do not
    /// lie inside the image.
    #[inline(always)]
    pub(in crate::code) fn data(&self, i: u32, s: &Section) -> Check<&'a [u8]> {
        if !occupies_file(s.kind(), self.cuda) {
            return Ok(&[]);
        }
        match bytes_at(self.b, s.offset(), s.size()) {
            Some(data) => Ok(data),
            None => Err(self.data_past_end(i, s)),
        }
    }

    #[cold]
    fn data_past_end(&self, i: u32, s: &Section) -> String {
        past_end(
            &self.label(i, s),
            s.offset(),
            s.size(),
            self.b.len(),
            self.whole,
        )
    }

    fn check_program_headers(&self) -> Check {
        if self.phnum == 0 {
            return Ok(());
        }
        check_table(
            "program header table",
            self.phoff,
            self.phnum,
            PROGRAM_HEADER_SIZE,
            self.b,
            self.whole,
        )?;
        // The table lies inside the image (checked above).
        let table = bytes_at(
            self.b,
            self.phoff,
            u64::from(self.phnum) * PROGRAM_HEADER_SIZE,
        )
        .unwrap_or_default();
        // A segment's file bytes lie inside the image. Its memory size is not checked against
        // them: CUDA 11.0's ptxas pads `.nv.global.init` so that a `PT_LOAD` holds 2 bytes more
        // in the file than in memory, and the driver loads such cubins (H200, driver 580,
        // `tests/structural_rules.rs`).
        let (mut rest, mut i) = (table, 0u64);
        while let Some((h, tail)) = rest.split_first_chunk::<{ PROGRAM_HEADER_SIZE as usize }>() {
            rest = tail;
            let offset = u64::from_le_bytes(field(h, 8));
            let file_size = u64::from_le_bytes(field(h, 32));
            if file_size > 0 && !fits(offset, file_size, self.b.len() as u64) {
                let kind = u32::from_le_bytes(field(h, 0));
                return Err(self.segment_past_end(i, kind, offset, file_size));
            }
            i += 1;
        }
        Ok(())
    }

    /// The refusal of program header `i`, whose file bytes are not inside the image.
    #[cold]
    fn segment_past_end(&self, i: u64, kind: u32, offset: u64, file_size: u64) -> String {
        let what = format!("program header {i} (type {kind:#x})");
        past_end(&what, offset, file_size, self.b.len(), self.whole)
    }

    fn check_sections(&self) -> Check {
        if self.shnum == 0 {
            return Ok(());
        }
        // Extended numbering keeps counts in section 0; without it section 0 is all zeros.
        let (null, headers) = self
            .headers
            .split_first_chunk::<{ SECTION_HEADER_SIZE as usize }>()
            .unwrap_or((&[0; SECTION_HEADER_SIZE as usize], &[]));
        // An OR of the bytes is a few vector instructions; the position only on the way out.
        if null.iter().fold(0, |any, &b| any | b) != 0 {
            let at = null.iter().position(|&b| b != 0).unwrap_or_default();
            return Err(format!(
                "section 0 has a non-zero byte at offset {at} of its header; the first section \
                 of an ELF file is the null section, all zeros"
            ));
        }
        // One pass over the headers: what every section must be on its own (its name, its bytes
        // inside the image, its links sections), where the symbol table is (in a cubin every
        // symbol index refers to its one symbol table, `symbols_of`, whatever section it is
        // in; it is checked for shape once, below), and whether the sections whose entries the
        // checks below read one by one share bytes. They must not, so that those checks read each
        // byte of the image at most once (many sections sharing the bytes of one would be read
        // again for each). The ELF standard says no sections overlap, but NVIDIA's do: nvcc 13
        // writes sections for sm_100 and later (`.nv.merc.*`) that mirror the bytes of others,
        // and relocatable cubins have sections of their own types that occupy no file bytes, at
        // the offset of the next.
        let (mut symtab, mut first_table) = (None, None);
        let mut walked = InOrder::default();
        let (mut rest, mut i) = (headers, 1);
        while let Some((header, tail)) = rest.split_first_chunk() {
            let s = Section::read(header);
            let kind = s.kind();
            if matches!(kind, SHT_SYMTAB | SHT_DYNSYM) {
                if self.cuda
                    && let Some(first) = first_table.replace(i)
                {
                    return Err(format!(
                        "{} and {} are both symbol tables; a CUDA cubin has one",
                        self.label_of(first),
                        self.label_of(i)
                    ));
                }
                if kind == SHT_SYMTAB && symtab.is_none() {
                    symtab = Some(i);
                }
            }
            self.check_section(i, &s)?;
            if is_walked(kind, self.cuda) {
                walked.push(i as usize - 1, s.offset(), s.size());
            }
            (rest, i) = (tail, i + 1);
        }
        if self.cuda && symtab.is_none() {
            return Err("a CUDA cubin without a symbol table (.symtab)".into());
        }
        let overlap = match walked.end() {
            Scanned::Apart => None,
            Scanned::Overlap(first, second) => Some((first, second)),
            Scanned::Unordered => overlapping(self.walked_ranges()),
        };
        if let Some((first, second)) = overlap {
            let (first, second) = (first as u32 + 1, second as u32 + 1);
            let range = |i| {
                let s = self.header(i).unwrap_or_default();
                format!("{}..{}", s.offset(), s.offset().saturating_add(s.size()))
            };
            return Err(format!(
                "{} (bytes {}) and {} (bytes {}) overlap; sections of an ELF file do not",
                self.label_of(first),
                range(first),
                self.label_of(second),
                range(second)
            ));
        }
        let symtab = match symtab {
            Some(index) if self.cuda => Some(self.symbols(index, &self.section(index)?, index)?),
            _ => None,
        };
        // Then every section's contents, in one pass, and what its links reach. A check that
        // follows a link checks what it reads there (the type of the section); the rest of that
        // section is checked when the pass gets to it.
        let (mut rest, mut i) = (headers, 1);
        while let Some((header, tail)) = rest.split_first_chunk() {
            let s = Section::read(header);
            match s.kind() {
                SHT_SYMTAB | SHT_DYNSYM => self.check_symbols(i, &s, symtab)?,
                SHT_REL | SHT_RELA => self.check_relocations(i, &s, symtab)?,
                SHT_HASH | SHT_GNU_HASH | SHT_GNU_VERSYM | SHT_GROUP | SHT_SYMTAB_SHNDX => {
                    self.symbols(i, &s, s.link())?;
                }
                SHT_DYNAMIC => {
                    self.strings(i, &s, s.link())?;
                }
                SHT_NOTE => self.check_notes(i, &s)?,
                // NVIDIA's own sections, and the checks of a cubin's code and data (none of the
                // types above).
                _ => {
                    if let Some(symtab) = &symtab {
                        cuda::check_section(self, i, &s, symtab)?;
                    }
                }
            }
            (rest, i) = (tail, i + 1);
        }
        Ok(())
    }

    /// The bytes of sections 1 and up that the checks below read entry by entry, as `(offset,
    /// size)`; none for other sections.
    fn walked_ranges(&self) -> impl Iterator<Item = (u64, u64)> + Clone + '_ {
        (1..self.shnum).map(|i| match self.header(i) {
            Some(s) if is_walked(s.kind(), self.cuda) => (s.offset(), s.size()),
            _ => (0, 0),
        })
    }

    /// What section `i` must be on its own: a name in the name table, its bytes inside the
    /// image, a power-of-two alignment, its links sections, a compression header where flagged,
    /// a string table ending in a NUL.
    #[inline(always)]
    fn check_section(&self, i: u32, s: &Section) -> Check {
        if s.name() as usize >= self.names.len() {
            return Err(format!(
                "section {i}: its name offset {} is outside the {}-byte section name table",
                s.name(),
                Size(self.names.len() as u64)
            ));
        }
        let data = self.data(i, s)?;
        // 0 and 1 (no alignment) and the powers of two have no bit in common with the number
        // below them.
        if s.align() & s.align().wrapping_sub(1) != 0 {
            return Err(format!(
                "{}: alignment {} is not a power of two",
                self.label(i, s),
                s.align()
            ));
        }
        if s.link() >= self.shnum {
            return Err(format!(
                "{}: sh_link {} is not one of the {} sections",
                self.label(i, s),
                s.link(),
                self.shnum
            ));
        }
        if s.flags() & u64::from(SHF_INFO_LINK | SHF_COMPRESSED) != 0 {
            self.check_flagged(i, s, data)?;
        }
        if s.kind() == SHT_STRTAB && data.last() != Some(&0) {
            return Err(format!(
                "{}: the string table does not end with a NUL byte",
                self.label(i, s)
            ));
        }
        Ok(())
    }

    /// What the flags `SHF_INFO_LINK` and `SHF_COMPRESSED` of section `i` promise: an `sh_info`
    /// that is 0 or a section, a compression header (out of line: few sections have either).
    /// `sh_info` 0 names no section, and nothing is read there: NVIDIA's own assembler flags
    /// `.nv.shared.reserved.0` so in cubins shipped for Blackwell, and the driver loads them
    /// (H200, driver 580, `tests/structural_rules.rs`).
    #[inline(never)]
    fn check_flagged(&self, i: u32, s: &Section, data: &[u8]) -> Check {
        if s.flag(SHF_INFO_LINK) && s.info() >= self.shnum {
            return Err(format!(
                "{}: sh_info {} is flagged as a section index (SHF_INFO_LINK) but is not one \
                 of the {} sections",
                self.label(i, s),
                s.info(),
                self.shnum
            ));
        }
        if s.flag(SHF_COMPRESSED) {
            self.check_compressed(i, s, data)?;
        }
        Ok(())
    }

    /// The symbol table whose indexes section `i` holds: the one its `sh_link` names, except in
    /// a cubin, which has one symbol table, `symtab`, whatever `sh_link` says (NVRTC 12.0 links
    /// relocation, attribute and code sections to `.nv.info`, and the driver loads them).
    fn symbols_of(&self, i: u32, s: &Section, symtab: Option<Symbols<'a>>) -> Check<Symbols<'a>> {
        match symtab {
            Some(symtab) => Ok(symtab),
            None => self.symbols(i, s, s.link()),
        }
    }

    /// The symbol table `index` that section `i` links to: a symbol table with 24-byte entries.
    fn symbols(&self, i: u32, s: &Section, index: u32) -> Check<Symbols<'a>> {
        let table = self.section(index)?;
        if !matches!(table.kind(), SHT_SYMTAB | SHT_DYNSYM) {
            return Err(format!(
                "{}: links to {}, which is not a symbol table",
                self.label(i, s),
                self.label(index, &table)
            ));
        }
        if table.entsize() != SYMBOL_SIZE || !table.size().is_multiple_of(SYMBOL_SIZE) {
            return Err(format!(
                "{}: entry size {} and size {}: a symbol table has whole {SYMBOL_SIZE}-byte entries",
                self.label(index, &table),
                table.entsize(),
                table.size()
            ));
        }
        Ok(Symbols {
            index,
            data: self.data(index, &table)?,
            count: table.size() / SYMBOL_SIZE,
        })
    }

    /// The string table `index` that section `i` links to (ending in a NUL: checked for every
    /// string table before links are followed).
    #[inline]
    fn strings(&self, i: u32, s: &Section, index: u32) -> Check<&'a [u8]> {
        let table = self.section(index)?;
        if table.kind() != SHT_STRTAB {
            return Err(format!(
                "{}: links to {}, which is not a string table",
                self.label(i, s),
                self.label(index, &table)
            ));
        }
        self.data(index, &table)
    }

    /// A compressed section (`SHF_COMPRESSED`) starts with a header saying how (`Elf64_Chdr`:
    /// `u32 type, u32 reserved, u64 size, u64 alignment`), which a reader follows.
    fn check_compressed(&self, i: u32, s: &Section, data: &[u8]) -> Check {
        const CHDR_SIZE: u64 = 24;
        let kind = u32_at(data, 0);
        if s.kind() == SHT_NOBITS
            || (data.len() as u64) < CHDR_SIZE
            || !matches!(kind, Some(ELFCOMPRESS_ZLIB | ELFCOMPRESS_ZSTD))
            || u64_at(data, 8) == Some(0)
        {
            return Err(format!(
                "{}: flagged compressed (SHF_COMPRESSED) without a zlib or zstd compression \
                 header",
                self.label(i, s)
            ));
        }
        Ok(())
    }

    fn check_symbols(&self, i: u32, s: &Section, symtab: Option<Symbols<'a>>) -> Check {
        let table = match symtab {
            Some(symtab) if symtab.index == i => symtab,
            _ => self.symbols(i, s, i)?,
        };
        let strings = self.strings(i, s, s.link())?;
        if u64::from(s.info()) > table.count {
            return Err(format!(
                "{}: sh_info {} (its first global symbol) is past its {} symbols",
                self.label(i, s),
                s.info(),
                table.count
            ));
        }
        // An OR of the bytes is a few vector instructions. A table without symbol 0 fails too.
        let null = bytes_at(table.data, 0, SYMBOL_SIZE).unwrap_or_default();
        if null.len() != SYMBOL_SIZE as usize || null.iter().fold(0, |any, &b| any | b) != 0 {
            return Err(format!(
                "{}: symbol 0 is not all zeros, as the undefined symbol is",
                self.label(i, s)
            ));
        }
        let (mut rest, mut n) = (table.data, 0u64);
        while let Some((entry, tail)) = rest.split_first_chunk() {
            let sym = Symbol::read(entry);
            if let Some(fault) = self.symbol_fault(sym, strings.len()) {
                return Err(self.symbol_refusal(i, s, &table, n, strings, fault));
            }
            (rest, n) = (tail, n + 1);
        }
        Ok(())
    }

    /// What is wrong with symbol `sym` of a table whose string table has `strings` bytes, if
    /// anything: the part of `check_symbols` that runs for every symbol.
    #[inline(always)]
    fn symbol_fault(&self, sym: Symbol, strings: usize) -> Option<SymbolFault> {
        if sym.name as usize >= strings {
            return Some(SymbolFault::Name);
        }
        // Bindings 3-9 and types 7-9 are reserved by the ELF standard; above them each OS and
        // processor has its own.
        if (STB_WEAK < sym.binding && sym.binding < STB_LOOS)
            || (STT_TLS < sym.kind && sym.kind < STT_LOOS)
        {
            return Some(SymbolFault::Reserved);
        }
        match sym.shndx {
            SHN_UNDEF | SHN_ABS | SHN_COMMON => None,
            SHN_XINDEX => Some(SymbolFault::ExtendedIndex),
            x if x < SHN_LORESERVE => {
                let index = u32::from(x);
                if index >= self.shnum {
                    return Some(SymbolFault::NoSection);
                }
                // In a cubin every section starts at address 0, so a function's or a variable's
                // value and size are a range of its section, which the driver reads. Elsewhere
                // values are addresses.
                if self.cuda && matches!(sym.kind, STT_FUNC | STT_OBJECT) {
                    // One of the table's (checked above).
                    let target = self.header(index).unwrap_or_default();
                    if !fits(sym.value, sym.size, target.size()) {
                        return Some(SymbolFault::PastSection);
                    }
                }
                None
            }
            // Processor-specific indexes: AMD's for LDS variables (SHN_AMDGPU_LDS).
            x if (SHN_LOPROC..=SHN_HIPROC).contains(&x) && !self.cuda => None,
            _ => Some(SymbolFault::ReservedIndex),
        }
    }

    /// The refusal for symbol `n` of `table`, section `i` (string table `strings`), for `fault`.
    /// The symbol is read again here, so that the loop over symbols keeps it in registers.
    #[cold]
    fn symbol_refusal(
        &self,
        i: u32,
        s: &Section,
        table: &Symbols,
        n: u64,
        strings: &[u8],
        fault: SymbolFault,
    ) -> String {
        let sym = table.get(n).unwrap_or(Symbol {
            name: 0,
            binding: 0,
            kind: 0,
            other: 0,
            shndx: 0,
            value: 0,
            size: 0,
        });
        let name = strings.get(sym.name as usize..).unwrap_or_default();
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        let what = format!(
            "{}: symbol {n} ({})",
            self.label(i, s),
            String::from_utf8_lossy(name.get(..end).unwrap_or_default())
        );
        let x = sym.shndx;
        match fault {
            SymbolFault::Name => format!(
                "{}: symbol {n}: its name offset {} is outside the {}-byte string table {}",
                self.label(i, s),
                sym.name,
                Size(strings.len() as u64),
                self.label_of(s.link())
            ),
            SymbolFault::Reserved => format!(
                "{what}: binding {} and type {} (st_info): one of them is reserved",
                sym.binding, sym.kind
            ),
            SymbolFault::ExtendedIndex => {
                format!("{what}: extended section indexes (SHN_XINDEX) are not supported")
            }
            SymbolFault::NoSection => format!(
                "{what}: section index {x} is not one of the {} sections",
                self.shnum
            ),
            SymbolFault::PastSection => {
                let index = u32::from(x);
                let target = self.header(index).unwrap_or_default();
                format!(
                    "{what}: value {} + size {} is past the end of {} ({} bytes)",
                    sym.value,
                    sym.size,
                    self.label(index, &target),
                    Size(target.size())
                )
            }
            SymbolFault::ReservedIndex => format!("{what}: section index {x:#x} is reserved"),
        }
    }

    fn check_relocations(&self, i: u32, s: &Section, symtab: Option<Symbols<'a>>) -> Check {
        let (entry, kind) = if s.kind() == SHT_REL {
            (REL_SIZE, "REL")
        } else {
            (RELA_SIZE, "RELA")
        };
        if s.entsize() != entry || !s.size().is_multiple_of(entry) {
            return Err(format!(
                "{}: entry size {} and size {}: a {kind} table has whole {entry}-byte entries",
                self.label(i, s),
                s.entsize(),
                s.size()
            ));
        }
        let data = self.data(i, s)?;
        let symbols = self.symbols_of(i, s, symtab)?;
        let target = match s.info() {
            // Dynamic relocations apply to the whole image, not to one section.
            0 if !self.cuda => None,
            0 => {
                return Err(format!(
                    "{}: sh_info 0 names no section to relocate",
                    self.label(i, s)
                ));
            }
            index => {
                let target = self
                    .section(index)
                    .map_err(|e| format!("{}: the section it relocates: {e}", self.label(i, s)))?;
                Some((index, target))
            }
        };
        // In cubins and relocatable files an offset is one into the target section; in
        // executables and shared objects it is an address.
        let section_offsets = self.cuda || self.file_type == ET_REL;
        for (n, rel) in (0u64..).zip(data.chunks_exact(entry as usize)) {
            let offset = u64_at(rel, 0).unwrap_or(0);
            let info = u64_at(rel, 8).unwrap_or(0);
            let (symbol, rtype) = (info >> 32, info & 0xffff_ffff);
            if symbol >= symbols.count {
                return Err(format!(
                    "{}: relocation {n}: symbol index {symbol} is past the {} symbols of {}",
                    self.label(i, s),
                    symbols.count,
                    self.label_of(symbols.index)
                ));
            }
            if self.cuda && !cuda::is_relocation_type(rtype) {
                return Err(format!(
                    "{}: relocation {n}: type {rtype:#x} is neither an R_CUDA type (below 0x100) \
                     nor an R_MERCURY one (0x10000 to 0x100ff)",
                    self.label(i, s)
                ));
            }
            if let Some((index, target)) = target
                && section_offsets
            {
                let width = if self.cuda {
                    cuda::relocated_bytes(rtype, &target)
                } else {
                    1
                };
                if !fits(offset, width, target.size()) {
                    return Err(format!(
                        "{}: relocation {n}: offset {offset} + {width} bytes is past the end of \
                         {} ({} bytes)",
                        self.label(i, s),
                        self.label(index, &target),
                        Size(target.size())
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_notes(&self, i: u32, s: &Section) -> Check {
        let data = self.data(i, s)?;
        let len = data.len() as u64;
        let in_tkinfo = self.cuda && self.name(s) == cuda::TKINFO_SECTION;
        let align: u64 = if s.align() == 8 { 8 } else { 4 };
        let round = |n: u64| n.checked_add(align - 1).map(|n| n & !(align - 1));
        let mut at = 0u64;
        while at < len {
            let too_long = || {
                format!(
                    "{}: the note at offset {at} runs past the end of the {}-byte section",
                    self.label(i, s),
                    Size(len)
                )
            };
            let (Some(name_size), Some(desc_size)) = (u32_at(data, at), u32_at(data, at + 4))
            else {
                return Err(too_long());
            };
            let end = at
                .checked_add(12 + u64::from(name_size))
                .and_then(round)
                .and_then(|desc| desc.checked_add(u64::from(desc_size)));
            let (Some(end), Some(kind)) = (end.filter(|&end| end <= len), u32_at(data, at + 8))
            else {
                return Err(too_long());
            };
            if self.cuda {
                let desc = bytes_at(data, end - u64::from(desc_size), u64::from(desc_size))
                    .unwrap_or_default();
                cuda::check_note(kind, desc, in_tkinfo).map_err(|why| {
                    format!("{}: the note at offset {at} {why}", self.label(i, s))
                })?;
            }
            at = round(end).unwrap_or(len);
        }
        Ok(())
    }
}

/// Whether a section of type `kind` has bytes in the file (of a cubin, when `cuda`).
#[inline]
fn occupies_file(kind: u32, cuda: bool) -> bool {
    !(matches!(kind, SHT_NOBITS | SHT_NULL) || (cuda && cuda::occupies_no_file(kind)))
}

/// Whether the checks read the bytes of a section of type `kind` entry by entry: symbol tables,
/// relocations, notes, and NVIDIA's records and call graph.
#[inline]
fn is_walked(kind: u32, cuda: bool) -> bool {
    matches!(
        kind,
        SHT_SYMTAB | SHT_DYNSYM | SHT_REL | SHT_RELA | SHT_NOTE
    ) || (cuda && cuda::is_record_section(kind))
}

/// The string at `offset` of string table `strings`, without its NUL; `None` when it does not
/// start and end inside the table.
pub(in crate::code) fn c_string(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let tail = strings.get(usize::try_from(offset).ok()?..)?;
    tail.get(..tail.iter().position(|&c| c == 0)?)
}

/// Checks that a table of `count` entries of `size` bytes at `offset` lies inside `b`, after its
/// ELF header.
#[inline]
fn check_table(what: &str, offset: u64, count: u16, size: u64, b: &[u8], whole: &str) -> Check {
    let bytes = u64::from(count) * size;
    if offset < HEADER_SIZE || !fits(offset, bytes, b.len() as u64) {
        return Err(table_refusal(what, offset, count, bytes, b, whole));
    }
    Ok(())
}

/// Why [`check_table`] refuses the table.
#[cold]
fn table_refusal(what: &str, offset: u64, count: u16, bytes: u64, b: &[u8], whole: &str) -> String {
    if offset < HEADER_SIZE {
        return format!("the {what} at offset {offset} overlaps the ELF header");
    }
    past_end(
        &format!("the {what} ({count} entries)"),
        offset,
        bytes,
        b.len(),
        whole,
    )
}
