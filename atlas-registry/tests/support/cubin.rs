//! Cubins taken apart for changes made on purpose, one structure at a time: the fields of the ELF
//! and section headers, symbols, relocations, `.nv.info` records and notes found by name, and
//! changes of layout that keep what a cubin means (a section's bytes, or the section header table,
//! moved to the end of the file, a section added), so that a field pointing just past a table
//! points just past the end of the blob.
//!
//! The reader is the tests' own, written apart from Atlas's, and trusts what it reads: it is
//! meant for the committed cubins it is given, and panics where they lack what is asked for.

/// The size of a section header.
pub const SECTION_HEADER_SIZE: usize = 64;
/// The size of a program header.
pub const PROGRAM_HEADER_SIZE: usize = 56;
/// The size of a symbol.
pub const SYMBOL_SIZE: usize = 24;

/// A field of a section header: its offset in the header and its width.
pub type Field = (usize, usize);
pub const SH_NAME: Field = (0, 4);
pub const SH_TYPE: Field = (4, 4);
pub const SH_FLAGS: Field = (8, 8);
pub const SH_OFFSET: Field = (24, 8);
pub const SH_SIZE: Field = (32, 8);
pub const SH_LINK: Field = (40, 4);
pub const SH_INFO: Field = (44, 4);
pub const SH_ALIGN: Field = (48, 8);
pub const SH_ENTSIZE: Field = (56, 8);

pub const SHT_PROGBITS: u32 = 1;
pub const SHT_SYMTAB: u32 = 2;
pub const SHT_STRTAB: u32 = 3;
pub const SHT_RELA: u32 = 4;
pub const SHT_NOTE: u32 = 7;
pub const SHT_NOBITS: u32 = 8;
pub const SHT_REL: u32 = 9;
pub const SHT_DYNSYM: u32 = 11;
pub const SHT_CUDA_INFO: u32 = 0x7000_0000;
pub const SHT_CUDA_CALLGRAPH: u32 = 0x7000_0001;
pub const SHT_CUDA_COMPAT: u32 = 0x7000_0086;
pub const SHF_EXECINSTR: u64 = 0x4;
pub const SHF_INFO_LINK: u64 = 0x40;
pub const SHF_COMPRESSED: u64 = 0x800;
pub const PT_LOAD: u32 = 1;

/// An `.nv.info` or `.nv.compat` attribute record.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Where its 4-byte header is, in the cubin.
    pub at: usize,
    pub format: u8,
    pub attribute: u8,
    /// The bytes of its value (format 4), else 0.
    pub size: usize,
}

impl Record {
    /// How many bytes the record takes, its padding included.
    pub fn span(&self) -> usize {
        (4 + self.size).div_ceil(4) * 4
    }
}

/// A note of a note section.
#[derive(Debug, Clone, Copy)]
pub struct Note {
    /// Where its 12-byte header (`namesz, descsz, type`) is, in the cubin.
    pub at: usize,
    pub kind: u32,
    /// Where its description is, and how long it is.
    pub desc_at: usize,
    pub desc_size: usize,
}

/// A cubin to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cubin {
    pub b: Vec<u8>,
}

impl Cubin {
    pub fn new(b: &[u8]) -> Self {
        Self { b: b.to_vec() }
    }

    pub fn len(&self) -> usize {
        self.b.len()
    }

    pub fn get(&self, at: usize, width: usize) -> u64 {
        self.b[at..at + width]
            .iter()
            .rev()
            .fold(0, |v, &byte| (v << 8) | u64::from(byte))
    }

    pub fn put(&mut self, at: usize, width: usize, value: u64) -> &mut Self {
        for (i, byte) in self.b[at..at + width].iter_mut().enumerate() {
            *byte = (value >> (8 * i)) as u8;
        }
        self
    }

    /// A copy with `value` in the `width` bytes at `at`.
    pub fn with(&self, at: usize, width: usize, value: u64) -> Vec<u8> {
        let mut c = self.clone();
        c.put(at, width, value);
        c.b
    }

    pub fn shoff(&self) -> usize {
        self.get(40, 8) as usize
    }

    pub fn shnum(&self) -> usize {
        self.get(60, 2) as usize
    }

    pub fn phoff(&self) -> usize {
        self.get(32, 8) as usize
    }

    pub fn phnum(&self) -> usize {
        self.get(56, 2) as usize
    }

    /// Where section header `i` is.
    pub fn header(&self, i: usize) -> usize {
        self.shoff() + SECTION_HEADER_SIZE * i
    }

    /// Field `field` of section header `i`.
    pub fn field(&self, i: usize, (at, width): Field) -> u64 {
        self.get(self.header(i) + at, width)
    }

    pub fn set(&mut self, i: usize, (at, width): Field, value: u64) -> &mut Self {
        let header = self.header(i);
        self.put(header + at, width, value)
    }

    /// A copy with field `field` of section `i` set to `value`.
    pub fn with_field(&self, i: usize, field: Field, value: u64) -> Vec<u8> {
        let mut c = self.clone();
        c.set(i, field, value);
        c.b
    }

    pub fn kind(&self, i: usize) -> u32 {
        self.field(i, SH_TYPE) as u32
    }

    pub fn offset(&self, i: usize) -> usize {
        self.field(i, SH_OFFSET) as usize
    }

    pub fn size(&self, i: usize) -> usize {
        self.field(i, SH_SIZE) as usize
    }

    /// The name of section `i`.
    pub fn name(&self, i: usize) -> String {
        let names = self.offset(self.get(62, 2) as usize);
        let at = names + self.field(i, SH_NAME) as usize;
        let end = at + self.b[at..].iter().position(|&c| c == 0).unwrap_or(0);
        String::from_utf8_lossy(&self.b[at..end]).into_owned()
    }

    /// The section called `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        (1..self.shnum()).find(|&i| self.name(i) == name)
    }

    /// The first section of type `kind`.
    pub fn of_kind(&self, kind: u32) -> Option<usize> {
        (1..self.shnum()).find(|&i| self.kind(i) == kind)
    }

    /// The symbol table.
    pub fn symtab(&self) -> usize {
        self.of_kind(SHT_SYMTAB)
            .expect("a cubin has a symbol table")
    }

    pub fn symbols(&self) -> usize {
        self.size(self.symtab()) / SYMBOL_SIZE
    }

    /// Where symbol `n` is.
    pub fn symbol(&self, n: usize) -> usize {
        self.offset(self.symtab()) + SYMBOL_SIZE * n
    }

    /// The first kernel's attribute section (`.nv.info.K`: `sh_info` names its code).
    pub fn kernel_info(&self) -> usize {
        (1..self.shnum())
            .find(|&i| self.kind(i) == SHT_CUDA_INFO && self.field(i, SH_INFO) != 0)
            .expect("a cubin with a kernel")
    }

    /// The first kernel's code section (`.text.K`).
    pub fn kernel_text(&self) -> usize {
        self.field(self.kernel_info(), SH_INFO) as usize
    }

    /// The first kernel's constant bank (`.nv.constant0.K`).
    pub fn kernel_bank(&self) -> usize {
        let name = self.name(self.kernel_text());
        let kernel = name.strip_prefix(".text.").expect("a .text.K section");
        self.index(&format!(".nv.constant0.{kernel}"))
            .expect("the kernel's constant bank")
    }

    /// The first kernel's symbol: the function whose section is its code.
    pub fn kernel_symbol(&self) -> usize {
        let text = self.kernel_text() as u64;
        (1..self.symbols())
            .find(|&n| {
                let s = self.symbol(n);
                self.get(s + 4, 1) & 0xf == 2 && self.get(s + 6, 2) == text
            })
            .expect("the kernel's symbol")
    }

    /// The records of attribute section `i`.
    pub fn records(&self, i: usize) -> Vec<Record> {
        let (start, end) = (self.offset(i), self.offset(i) + self.size(i));
        let mut records = Vec::new();
        let mut at = start;
        while at + 4 <= end {
            let format = self.b[at];
            let size = if format == 4 {
                self.get(at + 2, 2) as usize
            } else {
                0
            };
            let record = Record {
                at,
                format,
                attribute: self.b[at + 1],
                size,
            };
            records.push(record);
            at += record.span();
        }
        records
    }

    /// The first record of `attribute` in section `i`.
    pub fn record(&self, i: usize, attribute: u8) -> Option<Record> {
        self.records(i)
            .into_iter()
            .find(|r| r.attribute == attribute)
    }

    /// The notes of note section `i`.
    pub fn notes(&self, i: usize) -> Vec<Note> {
        let (start, end) = (self.offset(i), self.offset(i) + self.size(i));
        let mut notes = Vec::new();
        let mut at = start;
        while at + 12 <= end {
            let name = self.get(at, 4) as usize;
            let desc = self.get(at + 4, 4) as usize;
            let desc_at = at + 12 + name.div_ceil(4) * 4;
            notes.push(Note {
                at,
                kind: self.get(at + 8, 4) as u32,
                desc_at,
                desc_size: desc,
            });
            at = desc_at + desc.div_ceil(4) * 4;
        }
        notes
    }

    /// Where program header `n` is.
    pub fn program_header(&self, n: usize) -> usize {
        self.phoff() + PROGRAM_HEADER_SIZE * n
    }

    // -----------------------------------------------------------------------------------------
    // Layout: what the cubin means stays, where its parts lie changes.
    // -----------------------------------------------------------------------------------------

    /// Pads the file to a multiple of `align` (at least 1) and returns its length.
    fn pad_to(&mut self, align: usize) -> usize {
        let len = self.b.len().div_ceil(align.max(1)) * align.max(1);
        self.b.resize(len, 0);
        len
    }

    /// Copies the bytes of section `i` to the end of the file (aligned as the section is) and
    /// points the section at the copy: the section then ends where the file does.
    pub fn move_to_end(&mut self, i: usize) -> &mut Self {
        let bytes = self.b[self.offset(i)..self.offset(i) + self.size(i)].to_vec();
        let at = self.pad_to(self.field(i, SH_ALIGN) as usize);
        self.b.extend_from_slice(&bytes);
        self.set(i, SH_OFFSET, at as u64)
    }

    /// Copies the section header table to the end of the file and points `e_shoff` at the copy:
    /// the table then ends where the file does.
    pub fn headers_to_end(&mut self) -> &mut Self {
        self.headers_to_end_with(&[])
    }

    /// As [`headers_to_end`](Self::headers_to_end), with `more` headers after the table's
    /// (`e_shnum` counts them).
    fn headers_to_end_with(&mut self, more: &[[u8; SECTION_HEADER_SIZE]]) -> &mut Self {
        let table =
            self.b[self.shoff()..self.shoff() + SECTION_HEADER_SIZE * self.shnum()].to_vec();
        let at = self.pad_to(8);
        self.b.extend_from_slice(&table);
        for header in more {
            self.b.extend_from_slice(header);
        }
        let shnum = (self.shnum() + more.len()) as u64;
        self.put(40, 8, at as u64).put(60, 2, shnum)
    }

    /// Adds a section of header `header` whose bytes are `data` (appended, aligned to 8; none:
    /// the header's offset stands), with the section header table moved to the end; its index.
    pub fn add_section(
        &mut self,
        mut header: [u8; SECTION_HEADER_SIZE],
        data: Option<&[u8]>,
    ) -> usize {
        if let Some(data) = data {
            let at = self.pad_to(8);
            self.b.extend_from_slice(data);
            header[24..32].copy_from_slice(&(at as u64).to_le_bytes());
            header[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
        }
        let index = self.shnum();
        self.headers_to_end_with(&[header]);
        index
    }

    /// Section header `i` as it is.
    pub fn header_bytes(&self, i: usize) -> [u8; SECTION_HEADER_SIZE] {
        let at = self.header(i);
        self.b[at..at + SECTION_HEADER_SIZE]
            .try_into()
            .expect("64 bytes")
    }

    /// The bytes of section `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        &self.b[self.offset(i)..self.offset(i) + self.size(i)]
    }

    /// The file cut to `len` bytes.
    pub fn truncated(&self, len: usize) -> Vec<u8> {
        self.b[..len].to_vec()
    }
}
