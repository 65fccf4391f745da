//! ELF images: the structure that every reader of one walks, checked before the driver walks it.
//!
//! The driver's ELF reader trusts what it reads: a section header whose name, offset or size
//! points elsewhere, a symbol naming a section that does not exist, crashes the process inside
//! `cuModuleLoadData` (measured on an H200 with single-byte changes to real cubins). What is
//! checked here is what the driver's loader needs, rule by rule: each is kept because a sweep on
//! the H200 found the driver crashing, hanging or reading outside the blob without it
//! (`tests/structural_rules.rs`; RELIABILITY.md, "The sweep of structural rules"), or because
//! Atlas could not read the file as the driver does without it:
//!
//! - the header: 64-bit, little-endian (the layout every later read follows), the table entry
//!   sizes of ELF64, no extended numbering of program headers or sections;
//! - the program header table and the section header table lie inside the image, the section
//!   header table after the ELF header;
//! - the section name table exists and is a string table inside the image, and every section
//!   name starts inside it;
//! - every section's bytes lie inside the image (except `NOBITS` ones);
//! - every symbol's section index is a section (or undefined, absolute, common; no extended or
//!   reserved index);
//! - a relocation section's `sh_info`, when not 0, is a section;
//! - a cubin's toolkit note's strings lie inside it, and NVIDIA's records and flags that crashed
//!   the driver ([`cuda`]);
//! - the sections whose entries are read one by one (symbol tables, notes, `.nv.info`) are read
//!   at most a few times over: they may share bytes, but not so much that checking them would
//!   take more than linear time.
//!
//! What is not checked: instruction bytes, the meaning of values, and the structure the driver
//! was found to do without or to refuse cleanly itself (alignments, links between sections, the
//! shape of symbol tables, symbols' names, relocation entries, notes that run past their
//! section, and the rest that RELIABILITY.md lists as relaxed).
//!
//! The numbers of the ELF standard come from `object::elf`. The reading is our own: `object`'s
//! readers cast the image to its header types, which needs the image aligned for them (its
//! `unaligned` feature is off), while blobs come from `include_bytes!` and from inside fatbins and
//! bundles at any address; and a refusal here must say which section and which field is wrong.
//! It is the crate's one ELF reader: parameter layouts ([`crate::code::layout`]) read cubins
//! through [`Elf`] too, and check for themselves what they need of what is no longer checked
//! here (a string table's strings ending in a NUL, a symbol table's link).

pub(super) mod cuda;
pub(super) mod extent;

use std::borrow::Cow;

use object::elf::{
    ELFCLASS64, ELFDATA2LSB, EM_AMDGPU, EM_CUDA, SHN_ABS, SHN_COMMON, SHN_HIPROC, SHN_LOPROC,
    SHN_LORESERVE, SHN_UNDEF, SHN_XINDEX, SHT_DYNSYM, SHT_NOBITS, SHT_NOTE, SHT_NULL, SHT_REL,
    SHT_RELA, SHT_STRTAB, SHT_SYMTAB,
};

use super::read::{Check, Size, bytes_at, field, fits, past_end, u8_at, u16_at, u32_at, u64_at};

/// The first bytes of every ELF file.
pub(super) const MAGIC: &[u8] = b"\x7fELF";

const HEADER_SIZE: u64 = 64;
const PROGRAM_HEADER_SIZE: u64 = 56;
const SECTION_HEADER_SIZE: u64 = 64;
const SYMBOL_SIZE: u64 = 24;
/// How many times over the sections whose entries are read one by one may hold the image's
/// bytes: they lie inside it, so in toolchains' files, where no two share bytes, once at most.
const WALKED_PER_BYTE: u64 = 4;
/// `e_phnum` meaning "more than fit here": extended numbering, which GPU code never needs.
const PN_XNUM: u16 = 0xffff;

/// What an ELF image is read as, by where it was found. `e_machine` is the driver's to judge
/// (it refuses a cubin of another machine cleanly), so it only says which checks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::code) enum Machines {
    /// A module blob or a clang offload-bundle entry: an AMD GPU code object (`EM_AMDGPU`, for
    /// the SCALE/HIP toolchain) when it says so, else an NVIDIA cubin, whatever its `e_machine`.
    Gpu,
    /// An entry of an NVIDIA fatbin: an NVIDIA cubin, whatever its `e_machine`.
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

    #[inline(always)]
    fn flag(&self, flag: u32) -> bool {
        self.flags() & u64::from(flag) != 0
    }
}

/// The bytes of a symbol table, read as whole ELF64 symbols of 24 bytes whatever its
/// `sh_entsize` says, bytes after the last whole one left out (the driver loads cubins whose
/// table ends in part of a symbol).
#[derive(Debug, Clone, Copy)]
pub(in crate::code) struct Symbols<'a> {
    data: &'a [u8],
}

/// A symbol, as read.
#[derive(Debug, Clone, Copy)]
pub(in crate::code) struct Symbol {
    /// `st_name`: the offset of its name in the string table.
    pub(in crate::code) name: u32,
    /// `STT_*`, the low nibble of `st_info`.
    pub(in crate::code) kind: u8,
    /// `st_other`.
    pub(in crate::code) other: u8,
    /// `st_shndx`.
    pub(in crate::code) shndx: u16,
}

impl Symbols<'_> {
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
            kind: info & 0xf,
            other,
            shndx: u16::from_le_bytes(field(entry, 6)),
        }
    }
}

/// What can be wrong with a symbol's section index (see `Elf::symbol_fault`).
#[derive(Debug, Clone, Copy)]
enum SymbolFault {
    /// `SHN_XINDEX`.
    ExtendedIndex,
    /// Its section index is not a section.
    NoSection,
    /// Its section index is in the reserved range.
    ReservedIndex,
}

/// An ELF image whose header, section header table and section name table have been checked:
/// what every reader needs to find anything in it, and the reader of parameter layouts uses too.
pub(in crate::code) struct Elf<'a> {
    b: &'a [u8],
    whole: &'a str,
    cuda: bool,
    phoff: u64,
    phnum: u16,
    /// The section header table: `shnum` headers of 64 bytes.
    headers: &'a [u8],
    shnum: u32,
    /// The bytes of the section name table (whose last name may run to its end).
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
        // The layout every later read follows. The driver refuses a cubin relabelled so cleanly,
        // but a file of another class or byte order is one this reader cannot check as the
        // driver would read it: it is refused rather than handed over unchecked.
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
        // EI_VERSION, `e_type`, `e_ehsize` and `e_version` locate nothing, and the driver loads
        // cubins with any of them changed; `e_flags` is checked in `cuda::check_flags`. A file of
        // another machine is the driver's to refuse (it does, cleanly), checked as a cubin here
        // unless it is an AMD GPU code object where those are taken.
        let cuda = !(machines == Machines::Gpu && half(18) == EM_AMDGPU);
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
            // Extended numbering keeps the count in section 0 at e_shoff, and the driver reads
            // there (it read outside a blob whose e_shoff was 0): a table this reader does not
            // read is refused, not handed over unchecked.
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
                phoff,
                phnum,
                headers: &[],
                shnum: 0,
                names: &[],
            });
        }
        if u64::from(half(58)) != SECTION_HEADER_SIZE {
            return Err(format!(
                "e_shentsize is {}, not the {SECTION_HEADER_SIZE} bytes of an ELF64 section header",
                half(58)
            ));
        }
        // The driver crashed or hung on a table that overlaps the header (program headers may).
        if shoff < HEADER_SIZE {
            return Err(format!(
                "the section header table at offset {shoff} overlaps the ELF header"
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
        // Its last name need not end in a NUL: the driver reads names no further than the table.
        elf.names = bytes_at(b, table.offset(), table.size())
            .ok_or_else(|| past_end(&what(), table.offset(), table.size(), b.len(), whole))?;
        Ok(elf)
    }

    /// Sections 1 and up, with their indexes.
    pub(in crate::code) fn sections(&self) -> impl Iterator<Item = (u32, Section<'a>)> + '_ {
        (1..self.shnum).filter_map(|i| Some((i, self.header(i)?)))
    }

    /// The name of section `i`, `s`: the bytes before its NUL in the section name table; `None`
    /// when it does not start and end there (the table's last name may run to its end).
    pub(in crate::code) fn section_name(&self, s: &Section) -> Option<&'a [u8]> {
        c_string(self.names, s.name())
    }

    /// The first symbol table (`SHT_SYMTAB`) and the string table it links to, `None` when there
    /// is none; a refusal when it links to no string table.
    pub(in crate::code) fn symbol_table(&self) -> Check<Option<(Symbols<'a>, &'a [u8])>> {
        let Some((i, s)) = self.sections().find(|(_, s)| s.kind() == SHT_SYMTAB) else {
            return Ok(None);
        };
        let symbols = Symbols {
            data: self.data(i, &s)?,
        };
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

    /// The program header table lies inside the image: the driver reads outside a blob whose
    /// table does not. It may overlap the ELF header, and the segments' file bytes are not
    /// checked: the driver loads cubins with either (H200, driver 580,
    /// `tests/structural_rules.rs`), and nothing is read through them here.
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
        )
    }

    /// Every section on its own and what it holds, in one pass over the section header table:
    /// its name and bytes, and for the sections whose entries the driver follows (symbol tables,
    /// relocations, notes, NVIDIA's sections) what it follows in them.
    ///
    /// The sections whose entries are read one by one (symbol tables, notes, `.nv.info`) may
    /// share bytes: the ELF standard says no sections overlap, but NVIDIA's do (nvcc 13's
    /// `.nv.merc.*` sections for sm_100 and later mirror the bytes of others), and the driver
    /// loads a cubin with a second `.nv.info` over the bytes of the first. But checking them
    /// reads their bytes once per section, so together they may hold the image's bytes at most
    /// [`WALKED_PER_BYTE`] times over: many sections sharing one region would otherwise take
    /// time quadratic in the image. That is counted before each is read.
    fn check_sections(&self) -> Check {
        let budget = (self.b.len() as u64).saturating_mul(WALKED_PER_BYTE);
        let mut walked = 0u64;
        // Section 0 too: the null section by the standard, all zeros (and so checked in a few
        // comparisons), but the driver loads cubins whose section 0 is not, and whatever it
        // holds is checked as any other section's would be.
        let mut rest = self.headers;
        let mut i = 0;
        while let Some((header, tail)) = rest.split_first_chunk() {
            let s = Section::read(header);
            self.check_section(i, &s)?;
            let kind = s.kind();
            if is_walked(kind, self.cuda) {
                walked = walked.saturating_add(s.size());
                if walked > budget {
                    return Err(self.walked_too_much(walked));
                }
            }
            match kind {
                SHT_SYMTAB | SHT_DYNSYM => self.check_symbols(i, &s)?,
                SHT_REL | SHT_RELA => self.check_relocations(i, &s)?,
                SHT_NOTE => self.check_notes(i, &s)?,
                // NVIDIA's own sections, and the checks of a cubin's data (none of the types
                // above).
                _ if self.cuda => cuda::check_section(self, i, &s)?,
                _ => {}
            }
            (rest, i) = (tail, i + 1);
        }
        Ok(())
    }

    /// The refusal of sections read one by one that hold `walked` bytes in all.
    #[cold]
    fn walked_too_much(&self, walked: u64) -> String {
        format!(
            "the sections whose entries are read one by one (symbol tables, notes, .nv.info) \
             hold {} bytes in all, more than {WALKED_PER_BYTE} times the {}-byte {}: they share \
             bytes, and checking them would read each of those many times over",
            Size(walked),
            Size(self.b.len() as u64),
            self.whole
        )
    }

    /// What section `i` must be on its own: a name in the name table, its bytes inside the
    /// image. Its alignment, links, flags and a string table's last NUL are not checked: the
    /// driver loads cubins with any of them changed, or refuses them cleanly.
    #[inline(always)]
    fn check_section(&self, i: u32, s: &Section) -> Check {
        if s.name() as usize >= self.names.len() {
            return Err(format!(
                "section {i}: its name offset {} is outside the {}-byte section name table",
                s.name(),
                Size(self.names.len() as u64)
            ));
        }
        self.data(i, s).map(drop)
    }

    /// The string table `index` that section `i` links to.
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

    /// Each whole symbol of symbol table `i` names a section that exists, or none: the driver
    /// crashed on a symbol whose section index is past the section table or reserved. The
    /// rest of a symbol (its name, binding, type, value and size) and of the table (its entry
    /// size, `sh_info`, the null symbol) is the driver's to judge.
    fn check_symbols(&self, i: u32, s: &Section) -> Check {
        let (mut rest, mut n) = (self.data(i, s)?, 0u64);
        while let Some((entry, tail)) = rest.split_first_chunk() {
            let sym = Symbol::read(entry);
            if let Some(fault) = self.symbol_fault(sym) {
                return Err(self.symbol_refusal(i, s, n, sym, fault));
            }
            (rest, n) = (tail, n + 1);
        }
        Ok(())
    }

    /// What is wrong with symbol `sym`'s section index, if anything: the part of
    /// `check_symbols` that runs for every symbol.
    #[inline(always)]
    fn symbol_fault(&self, sym: Symbol) -> Option<SymbolFault> {
        match sym.shndx {
            SHN_UNDEF | SHN_ABS | SHN_COMMON => None,
            // The index is then in a SHT_SYMTAB_SHNDX table, which is not read here.
            SHN_XINDEX => Some(SymbolFault::ExtendedIndex),
            x if x < SHN_LORESERVE => {
                (u32::from(x) >= self.shnum).then_some(SymbolFault::NoSection)
            }
            // Processor-specific indexes: AMD's for LDS variables (SHN_AMDGPU_LDS).
            x if (SHN_LOPROC..=SHN_HIPROC).contains(&x) && !self.cuda => None,
            _ => Some(SymbolFault::ReservedIndex),
        }
    }

    /// The refusal for symbol `n`, `sym`, of symbol table `i`, for `fault`.
    #[cold]
    fn symbol_refusal(
        &self,
        i: u32,
        s: &Section,
        n: u64,
        sym: Symbol,
        fault: SymbolFault,
    ) -> String {
        // Its name, if the table links to a string table that holds it.
        let strings = self
            .header(s.link())
            .filter(|t| t.kind() == SHT_STRTAB)
            .and_then(|t| self.data(s.link(), &t).ok())
            .unwrap_or_default();
        let name = strings.get(sym.name as usize..).unwrap_or_default();
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        let what = format!(
            "{}: symbol {n} ({})",
            self.label(i, s),
            String::from_utf8_lossy(name.get(..end).unwrap_or_default())
        );
        let x = sym.shndx;
        match fault {
            SymbolFault::ExtendedIndex => {
                format!("{what}: extended section indexes (SHN_XINDEX) are not supported")
            }
            SymbolFault::NoSection => format!(
                "{what}: section index {x} is not one of the {} sections",
                self.shnum
            ),
            SymbolFault::ReservedIndex => format!("{what}: section index {x:#x} is reserved"),
        }
    }

    /// A relocation section's `sh_info`, when not 0, is a section: the driver crashed on one
    /// past the section table. Its entries (their size, symbols, types and offsets) the driver
    /// was found to read safely whatever they hold.
    fn check_relocations(&self, i: u32, s: &Section) -> Check {
        match s.info() {
            0 => Ok(()),
            index => self
                .section(index)
                .map(drop)
                .map_err(|e| format!("{}: the section it relocates: {e}", self.label(i, s))),
        }
    }

    /// The notes of section `i`, for what the driver follows in a cubin's (the strings of its
    /// toolkit note, [`cuda::check_note`]). The driver reads a note no further than its section:
    /// one that runs past it is read as far as the section goes, and ends the walk.
    fn check_notes(&self, i: u32, s: &Section) -> Check {
        if !self.cuda {
            return Ok(());
        }
        let data = self.data(i, s)?;
        let len = data.len() as u64;
        let in_tkinfo = self.name(s) == cuda::TKINFO_SECTION;
        let align: u64 = if s.align() == 8 { 8 } else { 4 };
        let round = |n: u64| n.saturating_add(align - 1) & !(align - 1);
        let mut at = 0u64;
        while let (Some(name_size), Some(desc_size), Some(kind)) =
            (u32_at(data, at), u32_at(data, at + 4), u32_at(data, at + 8))
        {
            let desc_at = round(at.saturating_add(12 + u64::from(name_size))).min(len);
            let desc_end = desc_at.saturating_add(u64::from(desc_size)).min(len);
            // Inside the section (both ends clamped to it).
            let desc = bytes_at(data, desc_at, desc_end - desc_at).unwrap_or_default();
            cuda::check_note(kind, desc, in_tkinfo)
                .map_err(|why| format!("{}: the note at offset {at} {why}", self.label(i, s)))?;
            at = round(desc_at.saturating_add(u64::from(desc_size)));
        }
        Ok(())
    }
}

/// Whether a section of type `kind` has bytes in the file (of a cubin, when `cuda`).
#[inline]
fn occupies_file(kind: u32, cuda: bool) -> bool {
    !(matches!(kind, SHT_NOBITS | SHT_NULL) || (cuda && cuda::occupies_no_file(kind)))
}

/// Whether the checks read the bytes of a section of type `kind` entry by entry (of a cubin, when
/// `cuda`): symbol tables, and a cubin's notes and `.nv.info` records.
#[inline]
fn is_walked(kind: u32, cuda: bool) -> bool {
    matches!(kind, SHT_SYMTAB | SHT_DYNSYM) || (cuda && (kind == SHT_NOTE || cuda::is_walked(kind)))
}

/// The string at `offset` of string table `strings`, without its NUL; `None` when it does not
/// start and end inside the table.
pub(in crate::code) fn c_string(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let tail = strings.get(usize::try_from(offset).ok()?..)?;
    tail.get(..tail.iter().position(|&c| c == 0)?)
}

/// Checks that a table of `count` entries of `size` bytes at `offset` lies inside `b`.
#[inline]
fn check_table(what: &str, offset: u64, count: u16, size: u64, b: &[u8], whole: &str) -> Check {
    let bytes = u64::from(count) * size;
    if !fits(offset, bytes, b.len() as u64) {
        return Err(past_end(
            &format!("the {what} ({count} entries)"),
            offset,
            bytes,
            b.len(),
            whole,
        ));
    }
    Ok(())
}
