//! Kernel parameter layouts read from the blob itself, for drivers that cannot report them.
//!
//! `cuFuncGetParamInfo` (CUDA 12.4+) tells Atlas how many parameters a kernel takes and where each
//! lies in the parameter buffer. Older drivers and profiler injection libraries lack it, and a
//! launch whose argument array is shorter than the kernel's parameter list makes the driver read
//! past that array. The layout is also written in the blob, and this module reads it there, with
//! no driver:
//!
//! - PTX: each `.entry` declares its `.param`s; offsets follow from each parameter's size and
//!   alignment, as the JIT compiler lays them out.
//! - ELF cubin: each kernel's `.nv.info.NAME` section holds one parameter record per parameter
//!   (ordinal, offset, size): `EIATTR_KPARAM_INFO`, or `EIATTR_KPARAM_INFO_V2` where the
//!   parameters take more than 4352 bytes (CUDA 12.1 and later allow 32764). Next to them stands
//!   the total size of the parameter buffer, which the reader checks the records against. The
//!   cubin is read with blob validation's ELF reader.
//!
//! On a driver without `cuFuncGetParamInfo`, a loaded fatbin's layouts are read from the entries
//! the driver may load for the device, and must agree ([`BlobLayouts`]).
//!
//! The reader refuses whatever it does not fully understand (unknown PTX syntax, unknown record
//! formats, records that disagree with each other) with a [`LayoutError`] saying what and where.
//! An error means "unknown", never a guess. Containers (fatbins, offload bundles) and other code
//! objects are [`LayoutError::NotReadable`]: their PTX and cubin entries are read one by one with
//! [`ptx_kernel_layouts`] and [`cubin_kernel_layouts`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use object::elf;

use crate::code::blob::BlobKind;
use crate::code::blob::elf::{Elf, Machines, Section, c_string};
use crate::code::dependency_wait::{CodeWaits, DependencyWait, code_waits};
use crate::code::ptx_lexer::{LexError, Lexer, Token};
use crate::code::target::{Code, Devices};

/// One kernel parameter: where it lies in the parameter buffer and how many bytes it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamSlot {
    /// Byte offset from the start of the parameter buffer.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Where a kernel's parameters start in constant bank 0 on devices of `compute_capability`, in
/// bytes, or `None` for an architecture Atlas does not know.
///
/// Offsets of parameters (`cuFuncGetParamInfo`, [`ParamSlot::offset`]) count from there, and the
/// compiler aligns a parameter in the bank, not in the parameter list: a 64-byte-aligned
/// `CUtensorMap` that comes first lies at offset 48 on sm_90, whose parameters start at 0x210.
/// Read from the `EIATTR_PARAM_CBANK` records of NVRTC 12.0's cubins (0x160 for sm_75 to sm_89,
/// 0x210 for sm_90) and from the constant banks of nvcc 13.0's sm_100 to sm_121 cubins (0x380).
pub(crate) fn param_bank_offset(compute_capability: (u32, u32)) -> Option<usize> {
    match compute_capability.0 {
        7 | 8 => Some(0x160),
        9 => Some(0x210),
        10..=12 => Some(0x380),
        _ => None,
    }
}

/// A kernel's name and its parameters, in declaration order.
///
/// Two layouts are equal when they name the same kernel and lay out the same parameters: what the
/// PTX calls them ([`declared`](Self::declared)) is not part of the layout, so a PTX text and a
/// cubin of one kernel agree.
#[derive(Debug, Clone)]
pub struct KernelLayout {
    /// The kernel's name as `cuModuleGetFunction` takes it (mangled, for C++ kernels).
    pub name: String,
    /// The parameters, first to last.
    pub params: Vec<ParamSlot>,
    /// Each parameter as the PTX declares it (name and type), first to last; empty for a cubin,
    /// whose records say where parameters lie but not what they are.
    pub declared: Vec<PtxParam>,
}

impl PartialEq for KernelLayout {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.params == other.params
    }
}

impl Eq for KernelLayout {}

impl std::hash::Hash for KernelLayout {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.params.hash(state);
    }
}

/// A kernel parameter as a PTX `.entry` declares it: `.param .u32 n`, `.param .align 8 .b8
/// p[24]`, `.param .u64 .ptr .global x`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PtxParam {
    /// The name as written, `None` where it is the one nvcc gives every parameter
    /// (`KERNEL_param_N`), which says nothing the position does not.
    name: Option<Box<str>>,
    /// The element type: `.u32`, `.f32`, `.b8`, ...
    ty: &'static str,
    /// How many elements: 1, or an array's length.
    elements: usize,
    /// Whether the declaration marks it a pointer (`.ptr`).
    pointer: bool,
}

impl PtxParam {
    /// The name as written, `None` where it is the one nvcc gives every parameter
    /// (`KERNEL_param_N`).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The element type as PTX writes it: `.u32`, `.f32`, `.b8`, ...
    pub fn ty(&self) -> &'static str {
        self.ty
    }

    /// How many elements of [`ty`](Self::ty) the parameter holds: 1, or an array's length (a
    /// struct passed by value is a `.b8` array).
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Whether the declaration marks the parameter a pointer (`.ptr`); nvcc declares most
    /// pointers as plain `.u64`.
    pub fn is_pointer(&self) -> bool {
        self.pointer
    }
}

impl std::fmt::Display for PtxParam {
    /// The declaration's type, as PTX writes it: `.u32`, `.u64 .ptr`, `.b8[24]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.ty)?;
        if self.pointer {
            f.write_str(" .ptr")?;
        }
        if self.elements != 1 {
            write!(f, "[{}]", self.elements)?;
        }
        Ok(())
    }
}

impl KernelLayout {
    /// Each parameter's size in bytes, first to last: what `cuFuncGetParamInfo` reports.
    pub fn sizes(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.params.iter().map(|p| p.size)
    }

    /// Bytes from the start of the parameter buffer to the end of the last parameter (0 for none).
    pub fn param_bytes(&self) -> usize {
        self.params
            .last()
            .map_or(0, |p| p.offset.saturating_add(p.size))
    }
}

/// A blob whose kernels this module cannot read directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnreadableBlob {
    /// A fatbin (magic `0xBA55ED50`): read its PTX and cubin entries one by one.
    Fatbin,
    /// A clang offload bundle: read its entries one by one.
    OffloadBundle,
    /// An ELF file for another machine than CUDA (224 is an AMD GPU code object).
    ForeignElf {
        /// The ELF header's `e_machine`.
        machine: u16,
    },
    /// Bytes that are neither PTX text nor an ELF file.
    Binary,
}

impl std::fmt::Display for UnreadableBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fatbin => f.write_str("a fatbin"),
            Self::OffloadBundle => f.write_str("a clang offload bundle"),
            Self::ForeignElf {
                machine: elf::EM_AMDGPU,
            } => f.write_str("an AMD GPU code object (ELF machine 224)"),
            Self::ForeignElf { machine } => {
                write!(
                    f,
                    "an ELF file for machine {machine}, not a CUDA cubin (190)"
                )
            }
            Self::Binary => f.write_str("binary data that is neither PTX text nor an ELF cubin"),
        }
    }
}

/// Why a kernel's parameter layout could not be read from a blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The blob is a container or code object that this reader does not read as a whole.
    #[error(
        "the blob is {0}: its parameter layouts are read from its PTX or cubin entries, one by one"
    )]
    NotReadable(UnreadableBlob),
    /// The PTX text has something the reader does not understand.
    #[error("PTX line {line}{}: {problem}", kernel_suffix(.kernel.as_deref()))]
    Ptx {
        /// The line (from 1) where the problem was found.
        line: usize,
        /// The kernel whose declaration it is in, if any.
        kernel: Option<String>,
        /// What was not understood.
        problem: PtxProblem,
    },
    /// The ELF cubin is malformed, or its records are missing, unknown or inconsistent.
    #[error("cubin{}: {problem}", kernel_suffix(.kernel.as_deref()))]
    Cubin {
        /// The kernel concerned, if the problem is one kernel's.
        kernel: Option<String>,
        /// What was wrong.
        problem: CubinProblem,
    },
}

fn kernel_suffix(kernel: Option<&str>) -> String {
    kernel.map_or_else(String::new, |k| format!(" (kernel `{}`)", k.escape_debug()))
}

/// What the PTX reader did not understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PtxProblem {
    /// The text is not UTF-8 from this byte offset on.
    #[error("the text is not UTF-8 at byte {offset}")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// A NUL byte stands before the end of the text (only trailing NULs are allowed).
    #[error("a NUL byte at byte {offset} is followed by more text")]
    NulByte {
        /// Byte offset of the NUL.
        offset: usize,
    },
    /// The text does not start with a `.version` directive, as every PTX module must.
    #[error("the text does not start with a `.version` directive")]
    NoVersion,
    /// A `/*` comment is never closed.
    #[error("a `/*` comment is never closed")]
    UnterminatedComment,
    /// A string literal is never closed.
    #[error("a string literal is never closed")]
    UnterminatedString,
    /// A `{` opened on this line is never closed.
    #[error("a `{{` opened here is never closed")]
    UnclosedBrace,
    /// A `}` closes nothing.
    #[error("a `}}` closes nothing")]
    StrayBrace,
    /// A token other than the ones the grammar allows here.
    #[error("found {found} where {expected} was expected")]
    Unexpected {
        /// The token found, quoted, or "the end of the text".
        found: String,
        /// What the grammar allows at this point.
        expected: &'static str,
    },
    /// A parameter type the reader does not know (`.pred`, `.texref`, a misspelling).
    #[error("unknown parameter type `{ty}`")]
    UnknownType {
        /// The type as written.
        ty: String,
    },
    /// A number that is not a PTX integer literal, or too large.
    #[error("`{text}` is not an integer the reader can use")]
    BadNumber {
        /// The number as written.
        text: String,
    },
    /// An `.align` that is not a power of two.
    #[error("`.align {align}` is not a power of two")]
    BadAlignment {
        /// The alignment as declared.
        align: usize,
    },
    /// An `.align` below the parameter type's own size, which the reader does not lay out.
    #[error("parameter `{param}` declares `.align {align}`, below its type's size {natural}")]
    AlignmentBelowType {
        /// The parameter's name.
        param: String,
        /// The declared alignment.
        align: usize,
        /// The size of its type.
        natural: usize,
    },
    /// An alignment above 16 bytes: the compiler aligns such a parameter within the constant bank,
    /// whose parameter base differs between GPU architectures, so its offset is not fixed by the
    /// PTX text.
    #[error(
        "parameter `{param}` is aligned to {align} bytes: its offset depends on the GPU it is \
         compiled for (only alignments up to 16 are fixed by the PTX)"
    )]
    TargetDependentOffset {
        /// The parameter's name.
        param: String,
        /// Its alignment.
        align: usize,
    },
    /// An array parameter of length zero.
    #[error("parameter `{param}` is an array of length 0")]
    EmptyArray {
        /// The parameter's name.
        param: String,
    },
    /// The parameters' sizes overflow.
    #[error("the parameters' sizes overflow")]
    TooLarge,
    /// Two kernels of one module with the same name.
    #[error("a second kernel named `{name}`")]
    DuplicateKernel {
        /// The name.
        name: String,
    },
}

/// What was wrong with an ELF cubin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CubinProblem {
    /// The ELF structure (header, section table, symbols) cannot be read.
    #[error("malformed ELF: {0}")]
    Elf(String),
    /// A big-endian ELF file: CUDA cubins are little-endian.
    #[error("a big-endian ELF file (CUDA cubins are little-endian)")]
    BigEndian,
    /// A kernel symbol whose name is not UTF-8.
    #[error("kernel symbol {symbol} has a name that is not UTF-8")]
    NameNotUtf8 {
        /// The symbol's index in `.symtab`.
        symbol: usize,
    },
    /// Two kernel symbols with the same name.
    #[error("two kernel symbols with this name")]
    DuplicateKernel,
    /// The kernel has no `.nv.info.NAME` section.
    #[error("no `.nv.info.` section for the kernel")]
    MissingInfo,
    /// The kernel has more than one `.nv.info.NAME` section.
    #[error("more than one `.nv.info.` section for the kernel")]
    DuplicateInfo,
    /// The kernel's `.nv.info.NAME` section is not of the CUDA info type (`0x70000000`).
    #[error("the kernel's `.nv.info.` section has type {sh_type:#x}, not 0x70000000")]
    InfoType {
        /// Its `sh_type`.
        sh_type: u32,
    },
    /// The kernel's `.nv.info.NAME` section describes another section than the kernel's code.
    #[error(
        "the kernel's `.nv.info.` section is linked to section {linked}, its code is in {code}"
    )]
    InfoLink {
        /// The info section's `sh_info`.
        linked: u32,
        /// The section index of the kernel's symbol.
        code: usize,
    },
    /// A record of a `.nv.info` section could not be used.
    #[error("`{}`, record at byte {at}: {issue}", .section.escape_debug())]
    Record {
        /// The section's name.
        section: String,
        /// Byte offset of the record in the section.
        at: usize,
        /// What is wrong with it.
        issue: RecordIssue,
    },
    /// No parameter record has this ordinal, though a later one does.
    #[error("no parameter record for parameter {ordinal}")]
    MissingOrdinal {
        /// The parameter index without a record.
        ordinal: usize,
    },
    /// Two parameter records with the same ordinal.
    #[error("two parameter records for parameter {ordinal}")]
    DuplicateOrdinal {
        /// The parameter index.
        ordinal: usize,
    },
    /// A parameter record with size 0.
    #[error("parameter {ordinal} has size 0")]
    ZeroSize {
        /// The parameter index.
        ordinal: usize,
    },
    /// A parameter that starts before the previous one ends.
    #[error(
        "parameter {ordinal} at offset {offset} overlaps the one before, which ends at {previous_end}"
    )]
    Overlap {
        /// The parameter index.
        ordinal: usize,
        /// Its offset.
        offset: usize,
        /// Where the previous parameter ends.
        previous_end: usize,
    },
    /// A total parameter size record that disagrees with the parameter records.
    #[error(
        "{attribute} says the parameters take {declared} bytes, the parameter records end at {records_end}"
    )]
    TotalMismatch {
        /// `EIATTR_CBANK_PARAM_SIZE` or `EIATTR_PARAM_CBANK`.
        attribute: &'static str,
        /// The size that record declares.
        declared: usize,
        /// Where the last parameter record ends.
        records_end: usize,
    },
    /// Parameter records without any total size record to check them against.
    #[error("parameter records without an EIATTR_CBANK_PARAM_SIZE or EIATTR_PARAM_CBANK record")]
    MissingTotal,
}

/// What was wrong with one `.nv.info` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordIssue {
    /// The record runs past the end of its section.
    #[error("it runs past the end of the section")]
    Truncated,
    /// A record format other than the four known ones (1 to 4).
    #[error("unknown record format {format:#x}")]
    UnknownFormat {
        /// The format byte.
        format: u8,
    },
    /// A known attribute in an unexpected format or length.
    #[error(
        "attribute {attribute:#x} in format {format:#x} with {len} value bytes, not as expected"
    )]
    Shape {
        /// The attribute byte.
        attribute: u8,
        /// The format byte.
        format: u8,
        /// The value's length in bytes.
        len: usize,
    },
    /// An attribute that describes parameters in a way this reader does not read (parameters in
    /// shared memory, or a parameter record in the module-wide `.nv.info` section).
    #[error("attribute {attribute:#x} describes parameters in a way this reader does not read")]
    Unsupported {
        /// The attribute byte.
        attribute: u8,
    },
    /// A second total-size record.
    #[error("a second record of attribute {attribute:#x}")]
    Duplicate {
        /// The attribute byte.
        attribute: u8,
    },
}

/// Every kernel of a PTX text or ELF cubin with its parameter layout, in the order the blob lists
/// them (PTX: text order; cubin: symbol table order).
///
/// Fatbins, offload bundles, other ELF files and other binary data are
/// [`LayoutError::NotReadable`]. PTX may end in NULs, as the driver takes it.
pub fn kernel_layouts(blob: &[u8]) -> Result<Vec<KernelLayout>, LayoutError> {
    read_code(blob, &mut Vec::new())
}

/// [`kernel_layouts`], adding to `variables` the names of the variables a PTX text or cubin
/// defines, read in the same pass ([`read_ptx`], [`read_cubin`]).
fn read_code(blob: &[u8], variables: &mut Vec<String>) -> Result<Vec<KernelLayout>, LayoutError> {
    if blob.starts_with(ELF_MAGIC) {
        read_cubin(blob, None, variables)
    } else if blob.starts_with(&FATBIN_MAGIC) {
        Err(LayoutError::NotReadable(UnreadableBlob::Fatbin))
    } else if blob.starts_with(BUNDLE_MAGIC) {
        Err(LayoutError::NotReadable(UnreadableBlob::OffloadBundle))
    } else if std::str::from_utf8(before_nul(blob)).is_ok() {
        read_ptx(blob, variables)
    } else {
        Err(LayoutError::NotReadable(UnreadableBlob::Binary))
    }
}

/// The layout of the kernel `name` of a PTX text or ELF cubin; `Ok(None)` when the blob has no
/// kernel of that name.
///
/// A cubin is read only as far as that kernel needs (its symbol and records); a PTX text is read
/// whole, so a problem in another kernel's declaration is an error here too.
pub fn kernel_layout(blob: &[u8], name: &str) -> Result<Option<KernelLayout>, LayoutError> {
    if blob.starts_with(ELF_MAGIC) {
        Ok(read_cubin(blob, Some(name), &mut Vec::new())?.pop())
    } else {
        Ok(kernel_layouts(blob)?.into_iter().find(|k| k.name == name))
    }
}

/// Every kernel's layout as the code the driver may load for some devices declares it (by name),
/// or why none can be read.
pub(crate) type DeviceLayouts = Result<HashMap<String, Result<KernelLayout, String>>, String>;

/// The parameter layouts of a loaded blob's kernels on some devices, read at their first need
/// (a typed launch, a parameter query, a preload) from the code the driver may load for them,
/// which this keeps until then: for a PTX text or a cubin, the blob; for a fatbin, every entry
/// the driver may load for the devices ([`Devices::may_load`]).
///
/// Why at first need: reading a PTX text's declarations costs about 20 instructions a byte, and
/// most of what a load costs Atlas when done at every load; many kernels of a model are never
/// launched with typed arguments, and a driver with `cuFuncGetParamInfo` needs only the count of
/// each launched kernel's parameters. What keeping costs: the code's bytes until the first need
/// (then they are dropped), one copy of a borrowed blob (a memory copy, against the 20
/// instructions a byte of reading it). A cubin in a compressed fatbin entry is read at once
/// instead, from the decompression that checked it: reading it costs a fraction of that
/// decompression (a few instructions a byte against tens), keeping it would hold its uncompressed
/// size, and decompressing it again would cost more than reading it. (Compressed PTX is kept
/// decompressed: reading it costs as much as decompressing it.)
///
/// The driver picks one of a fatbin's entries, and which is not known here (the best SASS, or PTX
/// under `CUDA_FORCE_PTX_JIT`), so a layout is one only when every entry it may pick declares it:
/// a kernel whose layouts differ between them, or that one of them lacks, has none (its `Err`
/// says why), and an entry that cannot be read makes every layout unknown. Never a guess.
///
/// What else the code says is read from it at the same time ([`Facts`]): whether each kernel waits
/// for the grid it depends on ([`dependency_wait`](crate::code::dependency_wait)), on the same
/// terms (what every entry says, else unknown), and the variables it defines for
/// `cuModuleGetGlobal` (of every entry; read in the same pass as the layouts).
#[derive(Debug)]
pub(crate) struct BlobLayouts {
    devices: Devices,
    /// The code to read, taken by the first need.
    pending: Mutex<Vec<Piece>>,
    read: OnceLock<DeviceLayouts>,
    /// What else the code says, read from it at the same time.
    facts: OnceLock<Facts>,
    /// What the layouts read hold on the heap ([`heap_bytes`](Self::heap_bytes)), counted as
    /// they are read.
    heap: OnceLock<usize>,
}

/// Code the driver may load, and its layouts or the bytes to read them from.
#[derive(Debug)]
struct Piece {
    /// A fatbin entry's code; `None` for the blob itself.
    code: Option<Code>,
    layouts: Pending,
    /// What else it says, when read already; `None`: read with the layouts.
    facts: Option<Facts>,
}

/// What a piece of code says besides its kernels' layouts.
#[derive(Debug)]
struct Facts {
    /// Whether its kernels wait for the grid they depend on.
    waits: CodeWaits,
    /// The variables it defines, for `cuModuleGetGlobal`.
    variables: Vec<String>,
}

/// The layouts of `code` (a PTX text or ELF cubin) and what else it says, its variables read in
/// the same pass as its layouts.
fn read_piece(code: &[u8]) -> (Result<Vec<KernelLayout>, LayoutError>, Facts) {
    let mut variables = Vec::new();
    let layouts = read_code(code, &mut variables);
    let facts = Facts {
        waits: code_waits(code),
        variables,
    };
    (layouts, facts)
}

impl Facts {
    /// Nothing known.
    fn unknown() -> Self {
        Self {
            waits: CodeWaits::unknown(),
            variables: Vec::new(),
        }
    }

    /// What a blob whose driver-loaded code is one of `pieces` says: the waits every piece
    /// agrees on, the variables any piece defines (sorted).
    fn merged(pieces: Vec<Facts>) -> Self {
        let mut variables = Vec::new();
        let waits = CodeWaits::agreed(pieces.into_iter().map(|piece| {
            variables.extend(piece.variables);
            piece.waits
        }));
        variables.sort_unstable();
        variables.dedup();
        Self { waits, variables }
    }

    /// Bytes held on the heap, roughly.
    fn heap_bytes(&self) -> usize {
        self.waits.heap_bytes()
            + self.variables.capacity() * std::mem::size_of::<String>()
            + self.variables.iter().map(String::capacity).sum::<usize>()
    }
}

#[derive(Debug)]
enum Pending {
    /// Read already.
    Read(Result<Vec<KernelLayout>, LayoutError>),
    /// The code, to read.
    Kept(Vec<u8>),
    /// The code, to read, shared with the blobs this process has checked
    /// ([`check_cache`](crate::code::check_cache)).
    Shared(Arc<[u8]>),
}

impl BlobLayouts {
    /// The layouts of `blob`, of `kind`: a PTX text or an ELF file is kept, to read at first need;
    /// of another kind but a fatbin, nothing can be read, which is said at once.
    pub(crate) fn of_blob(kind: BlobKind, blob: Cow<'_, [u8]>, devices: Devices) -> Self {
        let (layouts, facts) = match kind {
            BlobKind::Ptx | BlobKind::Cubin => (Pending::Kept(blob.into_owned()), None),
            _ => (Pending::Read(kernel_layouts(&blob)), Some(Facts::unknown())),
        };
        Self::of(
            devices,
            vec![Piece {
                code: None,
                layouts,
                facts,
            }],
        )
    }

    /// The layouts of `blob`, a PTX text or cubin, read at first need from those bytes.
    pub(crate) fn of_shared(blob: Arc<[u8]>) -> Self {
        Self::of(
            Devices::Every,
            vec![Piece {
                code: None,
                layouts: Pending::Shared(blob),
                facts: None,
            }],
        )
    }

    /// The layouts of a fatbin's entries on `devices`, none added yet: its check adds each entry
    /// the driver may load for them ([`add_entry`](Self::add_entry)).
    pub(crate) fn of_fatbin(devices: Devices) -> Self {
        Self::of(devices, Vec::new())
    }

    /// Layouts that cannot be known, for `why`.
    pub(crate) fn unknown(why: String) -> Self {
        let read: DeviceLayouts = Err(why);
        Self {
            devices: Devices::Every,
            pending: Mutex::new(Vec::new()),
            heap: OnceLock::from(heap_of(&read)),
            read: OnceLock::from(read),
            facts: OnceLock::from(Facts::unknown()),
        }
    }

    fn of(devices: Devices, pieces: Vec<Piece>) -> Self {
        Self {
            devices,
            pending: Mutex::new(pieces),
            read: OnceLock::new(),
            facts: OnceLock::new(),
            heap: OnceLock::new(),
        }
    }

    /// Adds a fatbin entry's `code`, `bytes` as checked: a cubin that had to be `decompressed` is
    /// read now, anything else kept (a copy) to read at first need.
    pub(crate) fn add_entry(&mut self, code: Code, bytes: &[u8], decompressed: bool) {
        let (layouts, facts) = if decompressed && matches!(code, Code::Sass(_)) {
            let (layouts, facts) = read_piece(bytes);
            (Pending::Read(layouts), Some(facts))
        } else {
            (Pending::Kept(bytes.to_vec()), None)
        };
        self.pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Piece {
                code: Some(code),
                layouts,
                facts,
            });
    }

    /// The layouts, read now if this is their first need.
    pub(crate) fn get(&self) -> &DeviceLayouts {
        self.read.get_or_init(|| {
            let pieces =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
            let (pieces, facts): (Vec<_>, Vec<_>) = pieces
                .into_iter()
                .map(|piece| {
                    let code = piece.code;
                    let (layouts, facts) = piece.read();
                    ((code, layouts), facts)
                })
                .unzip();
            let facts = Facts::merged(facts);
            let read = merge(pieces, self.devices);
            // Only this initialiser sets them, once.
            let _ = self.heap.set(heap_of(&read) + facts.heap_bytes());
            let _ = self.facts.set(facts);
            read
        })
    }

    /// Whether kernel `symbol` waits for the grid it depends on, as the code the driver may load
    /// says (read now with the layouts, if this is their first need).
    pub(crate) fn dependency_wait(&self, symbol: &str) -> DependencyWait {
        self.get();
        self.facts
            .get()
            .map_or(DependencyWait::Unknown, |facts| facts.waits.of(symbol))
    }

    /// The names of the variables the code the driver may load defines, sorted (read now with the
    /// layouts, if this is their first need); none where it cannot be read.
    pub(crate) fn variable_names(&self) -> Vec<String> {
        self.get();
        self.facts
            .get()
            .map_or_else(Vec::new, |facts| facts.variables.clone())
    }

    /// What the layouts hold on the heap once read, estimated from what they own: each kernel's
    /// names and parameters and the hash table's slots, each allocation as glibc's `malloc`
    /// rounds it (8 bytes of header, to 16, at least 32); `None` until their first need (until
    /// then they hold the code to read them from, which for [`of_shared`](Self::of_shared) is
    /// the caller's). Counted as they are read, outside any lock but theirs.
    ///
    /// Without the rounding it is what a counting allocator counts, to the byte (the demo
    /// model's PTX, and a 32 KiB text of 522 kernels: 97,500 bytes counted, 133,248 with the
    /// rounding). Measured against the code read: 0.005–0.13 of 77 PTX texts and cubins of
    /// NVIDIA's libraries (a few dozen kernels in megabytes), 0.13–1.5 of the demo model's, 4 of a
    /// text of tiny kernels.
    pub(crate) fn heap_bytes(&self) -> Option<usize> {
        self.heap.get().copied()
    }

    /// Whether the layouts have been read (the code kept for them dropped).
    #[cfg(test)]
    pub(crate) fn is_read(&self) -> bool {
        self.read.get().is_some()
    }

    /// The bytes of code kept to read.
    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending
            .iter()
            .map(|piece| match &piece.layouts {
                Pending::Kept(bytes) => bytes.len(),
                Pending::Shared(bytes) => bytes.len(),
                Pending::Read(_) => 0,
            })
            .sum()
    }
}

impl Piece {
    /// The piece's layouts and what else it says: read before, or now from its code.
    fn read(self) -> (Result<Vec<KernelLayout>, LayoutError>, Facts) {
        match self.layouts {
            Pending::Read(layouts) => (layouts, self.facts.unwrap_or_else(Facts::unknown)),
            Pending::Kept(bytes) => read_piece(&bytes),
            Pending::Shared(bytes) => read_piece(&bytes),
        }
    }
}

/// What `layouts` hold on the heap, as [`BlobLayouts::heap_bytes`] estimates it.
fn heap_of(layouts: &DeviceLayouts) -> usize {
    /// What `malloc` takes for `bytes` (none for none).
    fn chunk(bytes: usize) -> usize {
        match bytes {
            0 => 0,
            _ => (bytes + 8).next_multiple_of(16).max(32),
        }
    }
    let kernels = match layouts {
        Ok(kernels) => kernels,
        Err(why) => return chunk(why.capacity()),
    };
    // hashbrown: a power of two of slots, at least 8/7 of the capacity, each a key and a value,
    // and a control byte per slot (and a group's more).
    let slots = (kernels.capacity() * 8 / 7).next_power_of_two();
    let slot = std::mem::size_of::<(String, Result<KernelLayout, String>)>() + 1;
    let owned: usize = kernels
        .iter()
        .map(|(name, layout)| {
            chunk(name.capacity())
                + match layout {
                    Ok(kernel) => {
                        chunk(kernel.name.capacity())
                            + chunk(kernel.params.capacity() * std::mem::size_of::<ParamSlot>())
                            + chunk(kernel.declared.capacity() * std::mem::size_of::<PtxParam>())
                            + kernel
                                .declared
                                .iter()
                                .map(|p| chunk(p.name.as_ref().map_or(0, |name| name.len())))
                                .sum::<usize>()
                    }
                    Err(why) => chunk(why.capacity()),
                }
        })
        .sum();
    chunk(slots * slot + 16) + owned
}

/// The layouts of `pieces` (each with its code, `None` for the blob itself), merged as
/// [`BlobLayouts`] says.
type ReadPiece = (Option<Code>, Result<Vec<KernelLayout>, LayoutError>);

fn merge(pieces: Vec<ReadPiece>, devices: Devices) -> DeviceLayouts {
    let mut read = pieces.into_iter().map(|(code, layouts)| {
        let what = match code {
            None => "the blob".to_owned(),
            Some(Code::Sass(arch)) => format!("its sm_{arch} SASS"),
            Some(Code::Ptx(arch)) => format!("its compute_{arch} PTX"),
        };
        match layouts {
            Ok(layouts) => Ok((what, layouts)),
            Err(e) => Err(format!("{what}: {e}")),
        }
    });
    let Some(first) = read.next() else {
        return Err(format!(
            "the fatbin holds no code the driver may load for {devices}"
        ));
    };
    let (first, layouts) = first?;
    let mut kernels: HashMap<String, Result<KernelLayout, String>> = layouts
        .into_iter()
        .map(|kernel| (kernel.name.clone(), Ok(kernel)))
        .collect();
    for next in read {
        let (what, layouts) = next?;
        let mut declared = HashSet::with_capacity(layouts.len());
        for kernel in layouts {
            declared.insert(kernel.name.clone());
            let differs = |theirs: &KernelLayout| {
                format!(
                    "the code the driver may load for {devices} declares different parameter \
                     layouts: {first} {:?}, {what} {:?}",
                    theirs.sizes().collect::<Vec<_>>(),
                    kernel.sizes().collect::<Vec<_>>()
                )
            };
            match kernels.get_mut(&kernel.name) {
                // The PTX's names and types, where the first entry was a cubin.
                Some(Ok(theirs)) if *theirs == kernel => {
                    if theirs.declared.is_empty() {
                        theirs.declared = kernel.declared;
                    }
                }
                Some(Ok(theirs)) => {
                    let why = differs(theirs);
                    kernels.insert(kernel.name.clone(), Err(why));
                }
                Some(Err(_)) => {}
                None => {
                    let why = format!("{what} declares it, {first} does not");
                    kernels.insert(kernel.name.clone(), Err(why));
                }
            }
        }
        for (name, layout) in &mut kernels {
            if layout.is_ok() && !declared.contains(name) {
                *layout = Err(format!("{first} declares it, {what} does not"));
            }
        }
    }
    Ok(kernels)
}

const ELF_MAGIC: &[u8] = b"\x7fELF";
const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";

/// The bytes before the first NUL (the driver reads PTX up to there).
fn before_nul(blob: &[u8]) -> &[u8] {
    // Text (all PTX) is searched with `str::find`, which skips a word at a time; a byte loop costs
    // several times more, and every load reads its PTX's layouts.
    let end = match std::str::from_utf8(blob) {
        Ok(text) => text.find('\0'),
        Err(_) => blob.iter().position(|&b| b == 0),
    };
    end.map_or(blob, |end| &blob[..end])
}

// ---------------------------------------------------------------------------------------------
// PTX
// ---------------------------------------------------------------------------------------------

/// Every `.entry` of a PTX text with its parameter layout, in text order.
///
/// Kernels declared but not defined here (`.extern .entry NAME(...);`) and `.func`s are not
/// listed. Trailing NULs are allowed. Offsets follow the JIT compiler's rule: each parameter
/// starts at the next multiple of its `.align`, or of its type's size when it has none.
/// Parameters aligned above 16 bytes are refused
/// ([`PtxProblem::TargetDependentOffset`]).
pub fn ptx_kernel_layouts(ptx: &[u8]) -> Result<Vec<KernelLayout>, LayoutError> {
    read_ptx(ptx, &mut Vec::new())
}

/// [`ptx_kernel_layouts`], adding to `variables` the names of the variables the text defines for
/// `cuModuleGetGlobal` as it goes: its module-scope `.global` and `.const` declarations, not
/// `.extern` ones (defined elsewhere).
fn read_ptx(ptx: &[u8], variables: &mut Vec<String>) -> Result<Vec<KernelLayout>, LayoutError> {
    let text = ptx_text(ptx)?;
    let mut lexer = Lexer::new(text);
    let (first, line) = lexer.next()?;
    if first != Token::Directive(".version") {
        return Err(ptx_error(line, None, PtxProblem::NoVersion));
    }
    let mut kernels: Vec<KernelLayout> = Vec::new();
    // Looked up in a set: a text may declare tens of thousands of kernels.
    let mut names: HashSet<&str> = HashSet::new();
    // Within a module-scope declaration: whether it is `.extern`, whether it declares a variable
    // of `.global` or `.const` whose name has not come yet, and how deep in parentheses (a
    // `.func`'s parameter lists, whose `.ptr .global` declares no variable) it is.
    let (mut external, mut variable, mut parens) = (false, false, 0usize);
    loop {
        let (token, line) = lexer.next()?;
        match token {
            Token::End => return Ok(kernels),
            // Bodies of `.func`s and initializers of variables: nothing in them declares a kernel.
            Token::Punct('{') => {
                lexer.skip_block(line)?;
                (external, variable) = (false, false);
            }
            Token::Punct('}') => return Err(ptx_error(line, None, PtxProblem::StrayBrace)),
            Token::Punct('(') => parens += 1,
            Token::Punct(')') => parens = parens.saturating_sub(1),
            Token::Punct(';') => (external, variable) = (false, false),
            Token::Directive(".extern") => external = true,
            Token::Directive(".global" | ".const") if parens == 0 => variable = true,
            Token::Directive(".func") => variable = false,
            Token::Word(name) if variable => {
                if !external {
                    variables.push(name.to_owned());
                }
                variable = false;
            }
            Token::Directive(".entry") => {
                if let Some((name, kernel)) = entry(&mut lexer)? {
                    if !names.insert(name) {
                        return Err(ptx_error(
                            line,
                            Some(name),
                            PtxProblem::DuplicateKernel {
                                name: name.to_owned(),
                            },
                        ));
                    }
                    kernels.push(kernel);
                }
            }
            _ => {}
        }
    }
}

/// The text the driver would see: up to the first NUL, refusing anything but NULs after it.
fn ptx_text(ptx: &[u8]) -> Result<&str, LayoutError> {
    let text = before_nul(ptx);
    if ptx
        .get(text.len()..)
        .is_some_and(|tail| tail.iter().any(|&b| b != 0))
    {
        let offset = text.len();
        return Err(ptx_error(
            line_of(text),
            None,
            PtxProblem::NulByte { offset },
        ));
    }
    std::str::from_utf8(text).map_err(|e| {
        let offset = e.valid_up_to();
        ptx_error(
            line_of(&text[..offset]),
            None,
            PtxProblem::NotUtf8 { offset },
        )
    })
}

/// The line (from 1) at the end of `bytes`.
fn line_of(bytes: &[u8]) -> usize {
    1 + bytes.iter().filter(|&&b| b == b'\n').count()
}

impl From<LexError> for LayoutError {
    fn from(e: LexError) -> Self {
        match e {
            LexError::UnterminatedComment { line } => {
                ptx_error(line, None, PtxProblem::UnterminatedComment)
            }
            LexError::UnterminatedString { line } => {
                ptx_error(line, None, PtxProblem::UnterminatedString)
            }
            LexError::UnclosedBrace { line } => ptx_error(line, None, PtxProblem::UnclosedBrace),
        }
    }
}

fn ptx_error(line: usize, kernel: Option<&str>, problem: PtxProblem) -> LayoutError {
    LayoutError::Ptx {
        line,
        kernel: kernel.map(str::to_owned),
        problem,
    }
}

/// Size in bytes of each scalar type a kernel parameter can have.
fn ptx_type_size(ty: &str) -> Option<(&'static str, usize)> {
    PTX_TYPES.iter().copied().find(|&(known, _)| known == ty)
}

/// The parameter types of PTX and their sizes in bytes.
const PTX_TYPES: &[(&str, usize)] = &[
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

/// The integer types that `.ptr` may follow.
fn is_pointer_type(ty: &str) -> bool {
    matches!(ty, ".u64" | ".b64" | ".s64" | ".u32" | ".b32" | ".s32")
}

/// A PTX integer literal: decimal, `0x` hexadecimal, `0b` binary or `0` octal, with an optional
/// `U` suffix.
fn ptx_integer(text: &str) -> Option<usize> {
    let digits = text.strip_suffix('U').unwrap_or(text);
    let (radix, digits) = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, hex)
    } else if let Some(bin) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        (2, bin)
    } else if digits.len() > 1
        && let Some(oct) = digits.strip_prefix('0')
    {
        (8, oct)
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    usize::from_str_radix(digits, radix).ok()
}

/// One `.param` of an `.entry`, as declared.
struct ParamDecl<'t> {
    name: &'t str,
    line: usize,
    /// The declared `.align`, if any.
    align: Option<usize>,
    /// Its type, `.u32` or the like.
    ty: &'static str,
    /// Whether it is marked `.ptr`.
    pointer: bool,
    /// The size of its type.
    elem: usize,
    /// The number of elements (1 unless it is an array).
    count: usize,
}

/// Reads an `.entry` header after the `.entry` token, and skips its body: the kernel's name as
/// written and its layout, `None` for a declaration without a body.
fn entry<'t>(lexer: &mut Lexer<'t>) -> Result<Option<(&'t str, KernelLayout)>, LayoutError> {
    let (token, at) = lexer.next()?;
    let Token::Word(name) = token else {
        return Err(unexpected(token, at, None, "a kernel name after `.entry`"));
    };
    let layout = entry_after_name(lexer, name).map_err(|e| match e {
        LayoutError::Ptx {
            line,
            kernel: None,
            problem,
        } => ptx_error(line, Some(name), problem),
        other => other,
    })?;
    Ok(layout.map(|layout| (name, layout)))
}

/// [`entry`] from the parameter list on; errors do not name the kernel yet.
fn entry_after_name(
    lexer: &mut Lexer<'_>,
    name: &str,
) -> Result<Option<KernelLayout>, LayoutError> {
    let mut decls = Vec::new();
    let (mut token, mut line) = lexer.next()?;
    if token == Token::Punct('(') {
        (token, line) = lexer.next()?;
        if token != Token::Punct(')') {
            loop {
                decls.push(param(lexer, token, line)?);
                (token, line) = lexer.next()?;
                match token {
                    Token::Punct(',') => (token, line) = lexer.next()?,
                    Token::Punct(')') => break,
                    _ => return Err(unexpected(token, line, None, "`,` or `)`")),
                }
            }
        }
        (token, line) = lexer.next()?;
    }
    // Performance-tuning directives (`.maxntid 256, 1, 1`, `.reqntid`, `.minnctapersm`, ...) may
    // stand between the parameters and the body; they do not change the layout.
    loop {
        match token {
            Token::Punct('{') => {
                lexer.skip_block(line)?;
                break;
            }
            Token::Punct(';') => return Ok(None),
            Token::Directive(_) | Token::Number(_) | Token::Punct(',') => {
                (token, line) = lexer.next()?;
            }
            _ => return Err(unexpected(token, line, None, "the kernel's body `{`")),
        }
    }
    lay_out(name, &decls).map(Some)
}

fn unexpected(
    token: Token<'_>,
    line: usize,
    kernel: Option<&str>,
    expected: &'static str,
) -> LayoutError {
    ptx_error(
        line,
        kernel,
        PtxProblem::Unexpected {
            found: token.shown(),
            expected,
        },
    )
}

/// Reads one parameter declaration starting at `first` (on line `line`):
/// `.param [.align N] TYPE [.ptr [SPACE] [.align N]] NAME ([N])*`.
fn param<'t>(
    lexer: &mut Lexer<'t>,
    first: Token<'t>,
    line: usize,
) -> Result<ParamDecl<'t>, LayoutError> {
    if first != Token::Directive(".param") {
        return Err(unexpected(first, line, None, "`.param`"));
    }
    let mut align = None;
    let mut ty: Option<(&'static str, usize)> = None;
    // `.ptr`, and what may follow it: the pointee's state space and alignment, which do not
    // change the parameter itself.
    let (mut ptr, mut ptr_space, mut ptr_align) = (false, false, false);
    let name = loop {
        let (token, at) = lexer.next()?;
        match token {
            Token::Directive(".align") if ty.is_none() && align.is_none() => {
                align = Some(alignment(lexer)?);
            }
            Token::Directive(".ptr") if !ptr && ty.is_some_and(|(t, _)| is_pointer_type(t)) => {
                ptr = true;
            }
            Token::Directive(".global" | ".const" | ".local" | ".shared")
                if ptr && !ptr_space && !ptr_align =>
            {
                ptr_space = true;
            }
            Token::Directive(".align") if ptr && !ptr_align => {
                alignment(lexer)?;
                ptr_align = true;
            }
            Token::Directive(d) if ty.is_none() => match ptx_type_size(d) {
                Some(known) => ty = Some(known),
                None => {
                    return Err(ptx_error(
                        at,
                        None,
                        PtxProblem::UnknownType { ty: d.to_owned() },
                    ));
                }
            },
            Token::Word(name) if ty.is_some() => break name,
            _ => {
                let expected = if ty.is_none() {
                    "a parameter type or `.align`"
                } else {
                    "a parameter name, `.ptr` or the pointee's space or `.align`"
                };
                return Err(unexpected(token, at, None, expected));
            }
        }
    };
    let Some((ty, elem)) = ty else {
        return Err(unexpected(
            Token::Word(name),
            line,
            None,
            "a parameter type",
        ));
    };
    let mut count = 1usize;
    while lexer.peek()? == Token::Punct('[') {
        lexer.next()?;
        let (n, at) = number(lexer, "an array length")?;
        if n == 0 {
            return Err(ptx_error(
                at,
                None,
                PtxProblem::EmptyArray {
                    param: name.to_owned(),
                },
            ));
        }
        count = count
            .checked_mul(n)
            .ok_or_else(|| ptx_error(at, None, PtxProblem::TooLarge))?;
        let (close, at) = lexer.next()?;
        if close != Token::Punct(']') {
            return Err(unexpected(close, at, None, "`]`"));
        }
    }
    Ok(ParamDecl {
        name,
        line,
        align,
        ty,
        pointer: ptr,
        elem,
        count,
    })
}

/// The next token as a PTX integer, with its line; `expected` says what it should have been.
fn number(lexer: &mut Lexer<'_>, expected: &'static str) -> Result<(usize, usize), LayoutError> {
    let (token, at) = lexer.next()?;
    let Token::Number(text) = token else {
        return Err(unexpected(token, at, None, expected));
    };
    let n = ptx_integer(text).ok_or_else(|| {
        ptx_error(
            at,
            None,
            PtxProblem::BadNumber {
                text: text.to_owned(),
            },
        )
    })?;
    Ok((n, at))
}

/// The number after `.align`: a power of two.
fn alignment(lexer: &mut Lexer<'_>) -> Result<usize, LayoutError> {
    let (align, at) = number(lexer, "a number after `.align`")?;
    if !align.is_power_of_two() {
        return Err(ptx_error(at, None, PtxProblem::BadAlignment { align }));
    }
    Ok(align)
}

/// Offsets for `decls`: each at the next multiple of its alignment after the previous one.
///
/// The compiler aligns each parameter's address in the constant bank, whose parameter base is a
/// multiple of 16 on every architecture but not of more: up to 16, aligning the offset is the
/// same; above, the offset depends on the GPU, and the layout is refused.
fn lay_out(kernel: &str, decls: &[ParamDecl<'_>]) -> Result<KernelLayout, LayoutError> {
    let fail = |line, problem| Err(ptx_error(line, Some(kernel), problem));
    let mut end = 0usize;
    let mut params = Vec::with_capacity(decls.len());
    for d in decls {
        let align = d.align.unwrap_or(d.elem);
        if align < d.elem {
            return fail(
                d.line,
                PtxProblem::AlignmentBelowType {
                    param: d.name.to_owned(),
                    align,
                    natural: d.elem,
                },
            );
        }
        if align > 16 {
            return fail(
                d.line,
                PtxProblem::TargetDependentOffset {
                    param: d.name.to_owned(),
                    align,
                },
            );
        }
        let slot = end.checked_next_multiple_of(align).and_then(|offset| {
            let size = d.elem.checked_mul(d.count)?;
            end = offset.checked_add(size)?;
            Some(ParamSlot { offset, size })
        });
        match slot {
            Some(slot) => params.push(slot),
            None => return fail(d.line, PtxProblem::TooLarge),
        }
    }
    let declared = decls
        .iter()
        .enumerate()
        .map(|(index, d)| PtxParam {
            name: (!is_default_param_name(d.name, kernel, index)).then(|| d.name.into()),
            ty: d.ty,
            elements: d.count,
            pointer: d.pointer,
        })
        .collect();
    Ok(KernelLayout {
        name: kernel.to_owned(),
        params,
        declared,
    })
}

/// Whether `name` is what nvcc calls parameter `index` of `kernel`: `KERNEL_param_INDEX`.
fn is_default_param_name(name: &str, kernel: &str, index: usize) -> bool {
    name.strip_prefix(kernel)
        .and_then(|rest| rest.strip_prefix("_param_"))
        .is_some_and(|n| n.parse() == Ok(index))
}

// ---------------------------------------------------------------------------------------------
// ELF cubin
// ---------------------------------------------------------------------------------------------

/// Every kernel of an ELF cubin with its parameter layout, in symbol table order.
///
/// A kernel is a defined `STT_FUNC` symbol marked as an entry point (`st_other` bit `0x10`). Its
/// parameters are the parameter records of its `.nv.info.NAME` section, each 12 bytes: u32
/// index, u16 ordinal, u16 offset, then
///
/// - `EIATTR_KPARAM_INFO` (0x17): a u32 whose bits 18–31 are the size in bytes (bits 0–17 hold
///   the pointee's alignment and space, the constant bank, and whether the parameter is in it);
/// - `EIATTR_KPARAM_INFO_V2` (0x45), which ptxas writes for every parameter of a kernel whose
///   parameters take more than 4352 bytes: a u16 size in bytes, then a u16 of the pointee's
///   alignment and space (nvcc 13 writes 0x0500 for pointers in sm_100 and sm_120 code, 0
///   elsewhere).
///
/// Neither says more of where a parameter lies than its offset and size.
///
/// The records, of either kind or both, must number the parameters 0, 1, ... without gaps or
/// overlaps and end where the section's `EIATTR_CBANK_PARAM_SIZE` and `EIATTR_PARAM_CBANK`
/// records say; a kernel without parameter records has no parameters only if those records say
/// 0 or are absent.
pub fn cubin_kernel_layouts(cubin: &[u8]) -> Result<Vec<KernelLayout>, LayoutError> {
    read_cubin(cubin, None, &mut Vec::new())
}

/// `st_other` bit of a kernel entry point.
const STO_CUDA_ENTRY: u8 = 0x10;
/// `sh_type` of `.nv.info` sections.
const SHT_CUDA_INFO: u32 = 0x7000_0000;

/// Record formats: no value, a byte, a u16 (each in a 4-byte record), a u16 length and that many
/// bytes.
const EIFMT_NVAL: u8 = 0x01;
const EIFMT_BVAL: u8 = 0x02;
const EIFMT_HVAL: u8 = 0x03;
const EIFMT_SVAL: u8 = 0x04;

const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_SMEM_PARAM_OFFSETS: u8 = 0x0b;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_SMEM_PARAM_SIZE: u8 = 0x18;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

fn cubin_error(kernel: Option<&str>, problem: CubinProblem) -> LayoutError {
    LayoutError::Cubin {
        kernel: kernel.map(str::to_owned),
        problem,
    }
}

fn elf_error(e: String) -> LayoutError {
    cubin_error(None, CubinProblem::Elf(e))
}

/// The kernels of `cubin`, or only the one named `only`, read with the ELF reader of blob
/// validation: the header, section table and names it checks, and the bytes of each section
/// this reads checked to lie inside the file.
/// The layouts of a cubin's kernels (of `only`, when given), adding to `variables` the names of
/// the variables it defines for `cuModuleGetGlobal`: its defined object symbols, of any binding (a
/// `.global` that is not `.visible` is a local symbol, which `cuModuleGetGlobal` finds), but the
/// compiler's own (`$str`).
fn read_cubin(
    cubin: &[u8],
    only: Option<&str>,
    variables: &mut Vec<String>,
) -> Result<Vec<KernelLayout>, LayoutError> {
    if cubin.get(5) == Some(&elf::ELFDATA2MSB) {
        return Err(cubin_error(None, CubinProblem::BigEndian));
    }
    if let Some(machine) = cubin.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]]))
        && machine != elf::EM_CUDA
    {
        return Err(LayoutError::NotReadable(UnreadableBlob::ForeignElf {
            machine,
        }));
    }
    let image = Elf::parse(cubin, "cubin", Machines::Cuda).map_err(elf_error)?;

    // Each kernel's info section by name; `None` for a name that has more than one.
    let mut infos: HashMap<&[u8], Option<(u32, Section<'_>)>> = HashMap::new();
    for (index, section) in image.sections() {
        let name = image.section_name(index, &section).map_err(elf_error)?;
        if name == b".nv.info" {
            check_module_info(image.data(index, &section).map_err(elf_error)?)?;
        } else if let Some(kernel) = name.strip_prefix(b".nv.info.") {
            infos
                .entry(kernel)
                .and_modify(|slot| *slot = None)
                .or_insert(Some((index, section)));
        }
    }
    let Some((symbols, strings)) = image.symbol_table().map_err(elf_error)? else {
        return Ok(Vec::new());
    };

    let mut layouts: Vec<KernelLayout> = Vec::new();
    let mut names = HashSet::new();
    for (index, symbol) in symbols.iter().enumerate() {
        if symbol.kind == elf::STT_OBJECT
            && symbol.shndx != elf::SHN_UNDEF
            && let Some(name) = c_string(strings, symbol.name)
                .and_then(|raw| std::str::from_utf8(raw).ok())
                .filter(|name| !name.is_empty() && !name.starts_with(['$', '.']))
        {
            variables.push(name.to_owned());
        }
        if symbol.kind != elf::STT_FUNC
            || symbol.other & STO_CUDA_ENTRY == 0
            || symbol.shndx == elf::SHN_UNDEF
        {
            continue;
        }
        let raw = c_string(strings, symbol.name).ok_or_else(|| {
            elf_error(format!(
                "symbol {index}: its name offset {} is not a string of the symbol string table",
                symbol.name
            ))
        })?;
        if only.is_some_and(|name| name.as_bytes() != raw) {
            continue;
        }
        let name = std::str::from_utf8(raw)
            .map_err(|_| cubin_error(None, CubinProblem::NameNotUtf8 { symbol: index }))?;
        let fail = |problem| Err(cubin_error(Some(name), problem));
        if !names.insert(raw) {
            return fail(CubinProblem::DuplicateKernel);
        }
        let (info_index, info) = match infos.get(raw) {
            None => return fail(CubinProblem::MissingInfo),
            Some(None) => return fail(CubinProblem::DuplicateInfo),
            Some(Some(info)) => *info,
        };
        let sh_type = info.kind();
        if sh_type != SHT_CUDA_INFO {
            return fail(CubinProblem::InfoType { sh_type });
        }
        // The info section names the section of the code it describes; where it names one, it
        // must be this kernel's.
        let linked = info.info();
        let code = if symbol.shndx < elf::SHN_LORESERVE {
            usize::from(symbol.shndx)
        } else {
            0
        };
        if linked != 0 && usize::try_from(linked).ok() != Some(code) {
            return fail(CubinProblem::InfoLink { linked, code });
        }
        let records = image.data(info_index, &info).map_err(elf_error)?;
        let section = format!(".nv.info.{name}");
        let params =
            kernel_params(records, &section).map_err(|problem| cubin_error(Some(name), problem))?;
        layouts.push(KernelLayout {
            name: name.to_owned(),
            params,
            declared: Vec::new(),
        });
    }
    Ok(layouts)
}

/// One `.nv.info` record.
struct Record<'d> {
    /// Byte offset in its section.
    at: usize,
    format: u8,
    attribute: u8,
    /// The value bytes: two for the 4-byte formats, the declared length for `EIFMT_SVAL`.
    value: &'d [u8],
}

impl<'d> Record<'d> {
    fn issue(&self, section: &str, issue: RecordIssue) -> CubinProblem {
        CubinProblem::Record {
            section: section.to_owned(),
            at: self.at,
            issue,
        }
    }

    fn shape(&self, section: &str) -> CubinProblem {
        self.issue(
            section,
            RecordIssue::Shape {
                attribute: self.attribute,
                format: self.format,
                len: self.value.len(),
            },
        )
    }

    /// The value of an `EIFMT_SVAL` record of exactly `len` bytes.
    fn bytes(&self, section: &str, len: usize) -> Result<&'d [u8], CubinProblem> {
        if self.format == EIFMT_SVAL && self.value.len() == len {
            Ok(self.value)
        } else {
            Err(self.shape(section))
        }
    }

    /// The value of an `EIFMT_HVAL` record.
    fn half(&self, section: &str) -> Result<u16, CubinProblem> {
        match self.value {
            &[lo, hi] if self.format == EIFMT_HVAL => Ok(u16::from_le_bytes([lo, hi])),
            _ => Err(self.shape(section)),
        }
    }
}

/// Walks the records of a `.nv.info` section, each in turn; an unknown format ends the walk,
/// since the length of what follows is then unknown.
fn walk_records<'d>(
    bytes: &'d [u8],
    section: &str,
    mut each: impl FnMut(Record<'d>) -> Result<(), CubinProblem>,
) -> Result<(), CubinProblem> {
    let mut at = 0usize;
    while at < bytes.len() {
        let fail = |issue| CubinProblem::Record {
            section: section.to_owned(),
            at,
            issue,
        };
        let Some(head @ &[format, attribute, lo, hi]) = bytes.get(at..at + 4) else {
            return Err(fail(RecordIssue::Truncated));
        };
        let (value, next) = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => (&head[2..], at + 4),
            EIFMT_SVAL => {
                let end = at + 4 + usize::from(u16::from_le_bytes([lo, hi]));
                match bytes.get(at + 4..end) {
                    Some(value) => (value, end),
                    None => return Err(fail(RecordIssue::Truncated)),
                }
            }
            _ => return Err(fail(RecordIssue::UnknownFormat { format })),
        };
        each(Record {
            at,
            format,
            attribute,
            value,
        })?;
        at = next;
    }
    Ok(())
}

/// The module-wide `.nv.info` section must not describe parameters: they belong to each kernel's
/// own section, and one found here could not be told apart by kernel.
fn check_module_info(bytes: &[u8]) -> Result<(), LayoutError> {
    walk_records(bytes, ".nv.info", |record| match record.attribute {
        EIATTR_PARAM_CBANK
        | EIATTR_SMEM_PARAM_OFFSETS
        | EIATTR_KPARAM_INFO
        | EIATTR_SMEM_PARAM_SIZE
        | EIATTR_CBANK_PARAM_SIZE
        | EIATTR_KPARAM_INFO_V2 => Err(record.issue(
            ".nv.info",
            RecordIssue::Unsupported {
                attribute: record.attribute,
            },
        )),
        _ => Ok(()),
    })
    .map_err(|problem| cubin_error(None, problem))
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A kernel's parameters from the records of its `.nv.info.NAME` section.
fn kernel_params(bytes: &[u8], section: &str) -> Result<Vec<ParamSlot>, CubinProblem> {
    // (ordinal, slot) for each parameter record.
    let mut found: Vec<(usize, ParamSlot)> = Vec::new();
    let mut cbank_param_size: Option<usize> = None;
    let mut param_cbank: Option<usize> = None;
    walk_records(bytes, section, |record| {
        match record.attribute {
            EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2 => {
                let value = record.bytes(section, 12)?;
                let (Some(ordinal), Some(offset), Some(word)) =
                    (u16_at(value, 4), u16_at(value, 6), u32_at(value, 8))
                else {
                    return Err(record.shape(section));
                };
                let size = if record.attribute == EIATTR_KPARAM_INFO {
                    word >> 18
                } else {
                    word & 0xffff
                };
                found.push((
                    usize::from(ordinal),
                    ParamSlot {
                        offset: usize::from(offset),
                        size: size as usize,
                    },
                ));
            }
            EIATTR_CBANK_PARAM_SIZE => {
                let size = usize::from(record.half(section)?);
                if cbank_param_size.replace(size).is_some() {
                    return Err(record.issue(
                        section,
                        RecordIssue::Duplicate {
                            attribute: record.attribute,
                        },
                    ));
                }
            }
            EIATTR_PARAM_CBANK => {
                // u32 symbol of the constant bank section, u16 offset of the parameters in it,
                // u16 their size.
                let value = record.bytes(section, 8)?;
                let Some(size) = u16_at(value, 6) else {
                    return Err(record.shape(section));
                };
                if param_cbank.replace(usize::from(size)).is_some() {
                    return Err(record.issue(
                        section,
                        RecordIssue::Duplicate {
                            attribute: record.attribute,
                        },
                    ));
                }
            }
            EIATTR_SMEM_PARAM_OFFSETS | EIATTR_SMEM_PARAM_SIZE => {
                return Err(record.issue(
                    section,
                    RecordIssue::Unsupported {
                        attribute: record.attribute,
                    },
                ));
            }
            _ => {}
        }
        Ok(())
    })?;

    // ptxas writes the records last parameter first; order them by ordinal, which must count
    // 0, 1, 2, ... with none missing or repeated.
    found.sort_by_key(|&(ordinal, _)| ordinal);
    let mut params = Vec::with_capacity(found.len());
    let mut end = 0usize;
    for (expected, &(ordinal, slot)) in found.iter().enumerate() {
        if ordinal < expected {
            return Err(CubinProblem::DuplicateOrdinal { ordinal });
        }
        if ordinal > expected {
            return Err(CubinProblem::MissingOrdinal { ordinal: expected });
        }
        if slot.size == 0 {
            return Err(CubinProblem::ZeroSize { ordinal });
        }
        if slot.offset < end {
            return Err(CubinProblem::Overlap {
                ordinal,
                offset: slot.offset,
                previous_end: end,
            });
        }
        end = slot.offset + slot.size;
        params.push(slot);
    }
    if !params.is_empty() && cbank_param_size.is_none() && param_cbank.is_none() {
        return Err(CubinProblem::MissingTotal);
    }
    for (attribute, declared) in [
        ("EIATTR_CBANK_PARAM_SIZE", cbank_param_size),
        ("EIATTR_PARAM_CBANK", param_cbank),
    ] {
        if let Some(declared) = declared
            && declared != end
        {
            return Err(CubinProblem::TotalMismatch {
                attribute,
                declared,
                records_end: end,
            });
        }
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variables `code` defines, as a read of its layouts finds them.
    fn variable_names(code: &[u8]) -> Vec<String> {
        let mut variables = Vec::new();
        let _ = read_code(code, &mut variables);
        variables
    }

    #[test]
    fn ptx_variables_are_the_module_scope_global_and_const_ones_defined_here() {
        let ptx = b"
.version 8.0
.target sm_80
.address_size 64

// .global .u32 in_a_comment;
.extern .global .align 4 .u32 defined_elsewhere;
.global .align 4 .u32 counter;
.visible .global .align 4 .b8 bias[16] = {0, 0, 128, 63};
.const .align 8 .u64 table[2];
.visible .entry k(.param .u64 .ptr .global .align 4 x)
{
    .reg .b32 %r<2>;
    .shared .align 4 .b8 tile[64];
    ret;
}
.visible .global .align 8 .f64 after_the_kernel;
\0";
        assert_eq!(
            variable_names(ptx),
            ["counter", "bias", "table", "after_the_kernel"]
        );
    }

    #[test]
    fn cubin_variables_are_its_defined_global_objects() {
        for &sm in atlas_kernels::CUBIN_ARCHS {
            let blobs = atlas_kernels::cubin_for_model("demo", sm).unwrap();
            let (_, cubin) = blobs
                .iter()
                .find(|(name, _)| *name == "device_global")
                .unwrap();
            assert_eq!(variable_names(cubin), ["bias"], "sm_{sm}");
            let (_, cubin) = blobs
                .iter()
                .find(|(name, _)| *name == "elementwise")
                .unwrap();
            assert!(variable_names(cubin).is_empty(), "sm_{sm}");
        }
    }

    #[test]
    fn unreadable_code_lists_nothing() {
        assert!(variable_names(b"\x7fELF\x02\x01").is_empty());
        assert!(variable_names(b".version 8.0\n/* never closed").is_empty());
        assert!(variable_names(&[0xff, 0xfe]).is_empty());
    }
}
