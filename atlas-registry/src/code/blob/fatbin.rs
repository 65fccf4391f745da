//! NVIDIA fatbins: a container of PTX and cubin entries, one per architecture.
//!
//! Layout (little-endian), read from what CUDA toolchains write: nvcc 13.0's fatbins of every
//! `-arch` and `-compress-mode`, the committed one (`kernels/nvrtc.py` writes it from NVRTC
//! 12.0's PTX and cubins), what NVIDIA's nvFatbin library (12.9 and 13.5) makes of PTX and cubins
//! with and without names, ptxas options and compression (`testdata/cuda13.elementwise.fatbin`),
//! and the 6,552 fatbins of the `.nv_fatbin` sections of NVIDIA's CUDA 12 and 13 libraries
//! (cuBLAS, cuBLASLt, cuFFT, cuSPARSE, cuRAND, NPP); checked against public descriptions of the
//! format:
//!
//! - header, 16 bytes: `u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 body size`;
//!   the entries follow the header and fill the body exactly.
//! - entry header, 64 bytes, then an extension when `header size` says more:
//!   - `u16 kind` (1 PTX, 2 ELF) at 0, `u16 version` 0x0101 at 2, `u32 header size` at 4,
//!     `u64 payload size` at 8 (padded to 8), `u32 compressed size` at 16 (0 uncompressed);
//!   - `u32 options record` at 20: 0, or the offset in the entry of an 8-byte record `u32
//!     offset, u32 size` of the ptxas options, a NUL-terminated command line in the header
//!     (nvcc and nvFatbin write one for every PTX entry, empty unless options were given; CUDA
//!     12-era libraries write offset 0 and size 0), or of binary data for an ELF entry (nvFatbin
//!     13 writes 40 bytes for sm_100 and later);
//!   - `u16 minor, u16 major` code version at 24, `u32 arch` (90 for sm_90) at 28;
//!   - `u32 name offset, u32 name length` at 32: 0 and 0, or the entry's name (a source file
//!     name) in the header, NUL-terminated;
//!   - `u64 flags` at 40: `0x1` 64-bit, `0x2` debug, `0x4` CUDA, `0x8` OpenCL, `0x10` Linux, `0x20`
//!     Mac, `0x40` Windows, `0x2000` NVIDIA's LZ4 compression, `0x8000` zstd; nvcc 12.9 and 13
//!     also set `0x10_0000` on entries of "a" code (`sm_90a`, `compute_100a`), `0x20_0000` on
//!     those of "f" code (`sm_100f`, `compute_120f`: nothing else says "f"), and `0x100_0000` on
//!     every ELF entry from sm_100 on;
//!   - `u64` at 48 (0 in all of them), `u64 uncompressed size` at 56 (0 uncompressed).
//!
//!   The payload follows the header.
//!
//! What is checked, and why (see `RELIABILITY.md`, "Blob validation"):
//!
//! - Strict on structure, for every entry: the header lies inside the body, and what the driver
//!   follows in it: names and options inside the header with their NUL (measured on an H200,
//!   driver 580: a PTX entry whose name offset, options record offset, options offset or options
//!   text, its NUL overwritten, was changed crashed the driver inside `cuModuleLoadData`), the
//!   compressed size inside the payload and an uncompressed size for a compressed entry, no
//!   sizes of compression on a plain one.
//! - Permissive on meaning: flag bits, architectures, toolkit versions, option text and kinds
//!   Atlas does not know are the driver's to judge.
//! - Every byte the driver parses: the code of every entry the driver may pick for the device
//!   (see [`target`](crate::code::target); for [`validate_blob`](super::validate_blob), for any
//!   device) is checked as a blob of its kind is, compressed entries decompressed first
//!   ([`compressed`]). An entry the driver never picks for the device is not
//!   read beyond its header, so it cannot sink a fatbin whose other entries are fine.
//!
//! When what the driver loads of a fatbin for the device is settled (SASS of exactly its SM, see
//! [`sole_sass`]), a load checks that entry's code alone and hands the driver that cubin in place
//! of the fatbin: the driver then parses nothing else, and decompresses nothing a second time.

use std::borrow::Cow;
use std::ffi::CStr;

use object::elf::ET_EXEC;

use super::compressed::{self, Holds, Scheme};
use super::elf::{self, Machines};
use super::ptx;
use super::read::{Check, Refusal, Refused, Size, bytes_at, field, u16_at, u32_at, u64_at};
use super::sm_arch;
use crate::code::target::{Arch, Code, Devices, Features};

/// The fatbin magic, `0xBA55ED50`, as it is stored.
pub(super) const MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
const VERSION: u16 = 1;
const HEADER_SIZE: u64 = 16;
const ENTRY_HEADER_SIZE: u64 = 64;
/// The version of the entry header layout, in every entry toolchains write: it says where the
/// fields above are.
const ENTRY_VERSION: u16 = 0x0101;
/// An options record: `u32 offset, u32 size`.
const OPTIONS_RECORD_SIZE: u64 = 8;

const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;

/// The flags of compression: NVIDIA's older scheme (never seen in shipped code), its LZ4 block
/// format, zstd.
const FLAGS_COMPRESSED: u64 = 0x1000 | FLAG_LZ4 | FLAG_ZSTD;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// The flags of an entry of code for a feature set beyond the baseline: "a" (architecture-specific)
/// and "f" (family).
const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
const FLAG_FAMILY: u64 = 0x20_0000;

/// An entry header, as read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// Offset of the entry header in the fatbin.
    pub(super) at: u64,
    /// 1 PTX, 2 ELF.
    pub(super) kind: u16,
    version: u16,
    header_size: u64,
    payload_size: u64,
    compressed_size: u64,
    options_record: u64,
    /// The SM number (90 for sm_90): of the SASS for ELF, of the virtual architecture for PTX.
    pub(super) arch: u32,
    name_offset: u64,
    name_size: u64,
    flags: u64,
    uncompressed_size: u64,
}

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    Plain,
    Compressed(Scheme),
    /// Compressed in a way Atlas cannot read (flag 0x1000, or more than one flag).
    Unknown,
}

impl Entry {
    fn payload_at(&self) -> u64 {
        self.at + self.header_size
    }

    /// What code the entry holds, for the driver's choice; `None` for a kind Atlas does not know.
    /// Its feature set is what its flags say (with both flags, which no toolchain writes, the
    /// family's, which more devices run), not what its code says: the driver picks by the header.
    pub(super) fn code(&self) -> Option<Code> {
        let features = if self.flags & FLAG_FAMILY != 0 {
            Features::Family
        } else if self.flags & FLAG_ARCH_SPECIFIC != 0 {
            Features::Specific
        } else {
            Features::Baseline
        };
        let arch = Arch {
            sm: self.arch,
            features,
        };
        match self.kind {
            KIND_PTX => Some(Code::Ptx(arch)),
            KIND_ELF => Some(Code::Sass(arch)),
            _ => None,
        }
    }

    fn stored(&self) -> Stored {
        match self.flags & FLAGS_COMPRESSED {
            0 => Stored::Plain,
            FLAG_LZ4 => Stored::Compressed(Scheme::Lz4),
            FLAG_ZSTD => Stored::Compressed(Scheme::Zstd),
            _ => Stored::Unknown,
        }
    }

    /// `fatbin entry 1 (ELF sm_90 at offset 560)`, for refusals.
    fn label(&self, index: usize) -> String {
        let kind = match self.kind {
            KIND_PTX => "PTX",
            KIND_ELF => "ELF",
            _ => "unknown kind",
        };
        let stored = match self.stored() {
            Stored::Plain => "",
            Stored::Compressed(Scheme::Lz4) => ", LZ4-compressed",
            Stored::Compressed(Scheme::Zstd) => ", zstd-compressed",
            Stored::Unknown => ", compressed",
        };
        format!(
            "fatbin entry {index} ({kind} sm_{} at offset {}{stored})",
            self.arch, self.at
        )
    }
}

/// The entries of a fatbin, each header checked to lie inside the body; stops at the first bad
/// one.
pub(super) struct Entries<'a> {
    b: &'a [u8],
    at: u64,
    end: u64,
    index: usize,
}

/// Checks the fatbin header; returns its entries.
pub(super) fn entries(b: &[u8]) -> Check<Entries<'_>> {
    let len = b.len() as u64;
    if len < HEADER_SIZE {
        return Err(format!(
            "truncated fatbin: {} bytes, shorter than its 16-byte header",
            Size(len)
        ));
    }
    // The 16 header bytes are there (checked above).
    let version = u16_at(b, 4).unwrap_or(0);
    let header_size = u64::from(u16_at(b, 6).unwrap_or(0));
    let body = u64_at(b, 8).unwrap_or(0);
    if version != VERSION {
        return Err(format!(
            "fatbin version {version}; the layout Atlas checks is version {VERSION}'s"
        ));
    }
    let end = match header_size.checked_add(body) {
        Some(end) if header_size >= HEADER_SIZE && end <= len => end,
        _ => {
            return Err(format!(
                "truncated fatbin: its header declares {header_size} + {body} bytes, the blob has {}",
                Size(len)
            ));
        }
    };
    if body == 0 {
        return Err("the fatbin has no entries".into());
    }
    Ok(Entries {
        b,
        at: header_size,
        end,
        index: 0,
    })
}

impl Iterator for Entries<'_> {
    type Item = Check<Entry>;

    fn next(&mut self) -> Option<Check<Entry>> {
        let at = self.at;
        if at >= self.end {
            return None;
        }
        // Whatever happens, this is the last entry unless it is well formed.
        self.at = self.end;
        let index = self.index;
        self.index += 1;
        let end = self.end;
        if end - at < ENTRY_HEADER_SIZE {
            return Some(Err(format!(
                "truncated fatbin: entry {index} at offset {at} has no room for its \
                 {ENTRY_HEADER_SIZE}-byte header before the fatbin ends at {end}"
            )));
        }
        let h: &[u8; ENTRY_HEADER_SIZE as usize] =
            bytes_at(self.b, at, ENTRY_HEADER_SIZE)?.try_into().ok()?;
        let u16_ = |at| u16::from_le_bytes(field(h, at));
        let u32_ = |at| u64::from(u32::from_le_bytes(field(h, at)));
        let u64_ = |at| u64::from_le_bytes(field(h, at));
        let entry = Entry {
            at,
            kind: u16_(0),
            version: u16_(2),
            header_size: u32_(4),
            payload_size: u64_(8),
            compressed_size: u32_(16),
            options_record: u32_(20),
            arch: u32::from_le_bytes(field(h, 28)),
            name_offset: u32_(32),
            name_size: u32_(36),
            flags: u64_(40),
            uncompressed_size: u64_(56),
        };
        let next = entry
            .header_size
            .checked_add(entry.payload_size)
            .and_then(|n| n.checked_add(at));
        match next {
            Some(next) if entry.header_size >= ENTRY_HEADER_SIZE && next <= end => {
                self.at = next;
                Some(Ok(entry))
            }
            _ => Some(Err(format!(
                "malformed fatbin: {} declares a {}-byte header and a {}-byte payload; the fatbin \
                 ends at {end} (truncated or corrupt)",
                entry.label(index),
                entry.header_size,
                entry.payload_size
            ))),
        }
    }
}

/// Checks a fatbin: its header, every entry's header, and (for `devices`, `None` for none) the
/// code of each entry the driver may pick for those devices.
pub(super) fn check(b: &[u8], devices: Option<Devices>) -> Refused {
    check_picked(b, devices, |_, _, _| {})
}

/// As [`check`], handing each picked entry's code, once checked, to `picked`: what code it is, its
/// bytes (decompressed), and whether they had to be decompressed (they are then in a buffer that
/// the next compressed entry reuses). So a load reads what it needs of the code from the one
/// decompression that checked it.
pub(in crate::code) fn check_picked(
    b: &[u8],
    devices: Option<Devices>,
    mut picked: impl FnMut(Code, &[u8], bool),
) -> Refused {
    // One buffer for what every compressed entry decompresses to.
    let mut buffer = Vec::new();
    for (index, entry) in entries(b)?.enumerate() {
        let entry = entry?;
        let code = entry
            .code()
            .filter(|&code| devices.is_some_and(|d| d.may_load(code)));
        let checked = check_entry(b, &entry, code.is_some(), &mut buffer)
            .map_err(|e| e.within(&entry.label(index)))?;
        if let (Some(code), Some(bytes)) = (code, checked) {
            picked(code, bytes, entry.stored() != Stored::Plain);
        }
    }
    Ok(())
}

/// The cubin a load on a device of SM number `device` hands the driver in place of fatbin `b`,
/// when what the driver loads of it is settled: one entry holds SASS of exactly the device's SM
/// (plain, "f" or "a": each runs there), an executable cubin (not a relocatable one, which needs
/// a link), no other entry holds SASS the device may load (an older minor version's, plain or
/// "f"; never "a" SASS of another compute capability, which the driver does not load there), and
/// every entry is of a kind Atlas knows. The driver takes SASS built for the device over any PTX
/// (the caller has seen that no environment variable makes it JIT the PTX:
/// [`jit_forced`](crate::code::target::jit_forced)), so that cubin is what it would load.
///
/// Every entry's header is checked, and that entry's code, decompressed, as [`check_picked`]
/// checks it; the cubin is borrowed from `b` when stored plain. `None` when the choice is not
/// settled: the whole fatbin is then checked for the device ([`check_picked`]) and handed over.
pub(in crate::code) fn sole_sass(b: &[u8], device: u32) -> Refused<Option<Cow<'_, [u8]>>> {
    let devices = Devices::Sm(device);
    let (mut sole, mut settled) = (None, true);
    for (index, entry) in entries(b)?.enumerate() {
        let entry = entry?;
        let header = bytes_at(b, entry.at, entry.header_size).unwrap_or_default();
        check_header(header, &entry).map_err(|e| format!("{}: {e}", entry.label(index)))?;
        match entry.code() {
            None => settled = false,
            Some(code @ Code::Sass(arch)) if devices.may_load(code) => {
                if arch.sm == device && sole.is_none() {
                    sole = Some((index, entry));
                } else {
                    settled = false;
                }
            }
            Some(_) => {}
        }
    }
    let Some((index, entry)) = sole.filter(|_| settled) else {
        return Ok(None);
    };
    let mut buffer = Vec::new();
    let code = code(b, &entry, &mut buffer)
        .and_then(|code| {
            check_code(&entry, code)
                .map(|()| code)
                .map_err(Refusal::from)
        })
        .map_err(|e| e.within(&entry.label(index)))?;
    if u16_at(code, 16) != Some(ET_EXEC) || sm_arch(code) != Some(device) {
        return Ok(None);
    }
    Ok(Some(match entry.stored() {
        Stored::Plain => Cow::Borrowed(payload(b, &entry)),
        _ => Cow::Owned(buffer),
    }))
}

/// Checks entry `entry` of fatbin `b`: its header, and its code when `picked`; that code.
fn check_entry<'a>(
    b: &'a [u8],
    entry: &Entry,
    picked: bool,
    buffer: &'a mut Vec<u8>,
) -> Refused<Option<&'a [u8]>> {
    // The whole header lies inside the fatbin (checked when the entry was read).
    let header = bytes_at(b, entry.at, entry.header_size).unwrap_or_default();
    check_header(header, entry)?;
    if !picked {
        return Ok(None);
    }
    let code = code(b, entry, buffer)?;
    check_code(entry, code)?;
    Ok(Some(code))
}

/// The code of `entry` of fatbin `b`: its payload, or, compressed, what that decompresses to (in
/// `buffer`). Its sizes have been checked ([`check_header`]).
fn code<'a>(b: &'a [u8], entry: &Entry, buffer: &'a mut Vec<u8>) -> Refused<&'a [u8]> {
    // The compressed size lies inside the payload (`check_header`).
    let payload = payload(b, entry);
    match entry.stored() {
        Stored::Plain => Ok(payload),
        Stored::Compressed(scheme) => {
            let stream = payload
                .get(..entry.compressed_size as usize)
                .unwrap_or_default();
            let holds = match entry.kind {
                KIND_ELF => Holds::Cubin,
                _ => Holds::Other,
            };
            compressed::decompress(scheme, stream, entry.uncompressed_size, holds, buffer)?;
            Ok(buffer)
        }
        Stored::Unknown => Err(format!(
            "flags {:#x} name a compression Atlas cannot read (0x2000 LZ4, 0x8000 zstd), so the \
             code the driver would decompress cannot be checked",
            entry.flags
        )
        .into()),
    }
}

/// The payload of `entry` of fatbin `b` (inside the fatbin: checked when the entry was read).
fn payload<'a>(b: &'a [u8], entry: &Entry) -> &'a [u8] {
    bytes_at(b, entry.payload_at(), entry.payload_size).unwrap_or_default()
}

/// Checks the code of an entry (its payload, decompressed) as a blob of its kind is checked.
fn check_code(entry: &Entry, code: &[u8]) -> Check {
    match entry.kind {
        KIND_ELF => elf::check(code, "ELF payload", Machines::Cuda),
        // PTX is stored NUL-terminated (padded with more NULs to a multiple of 8) and read as a
        // C string: it must end inside the payload (found with the word-at-a-time search).
        _ => match CStr::from_bytes_until_nul(code) {
            Ok(text) => ptx::check(text.to_bytes()),
            Err(_) => Err(format!(
                "the {}-byte PTX payload has no terminating NUL byte",
                Size(code.len() as u64)
            )),
        },
    }
}

/// What each entry of fatbin `b` holds, in order, as far as its headers can be read (for a fatbin
/// that passed its check, every entry): its code, or `None` for a kind Atlas does not know.
pub(in crate::code) fn codes(b: &[u8]) -> impl Iterator<Item = Option<Code>> + '_ {
    entries(b)
        .into_iter()
        .flatten()
        .map_while(Result::ok)
        .map(|entry| entry.code())
}

/// The structure of an entry's header, which the driver follows before it picks an entry: the
/// layout version, its strings, and the sizes of its payload. `header` is the whole header,
/// extension included.
fn check_header(header: &[u8], entry: &Entry) -> Check {
    if entry.version != ENTRY_VERSION {
        return Err(format!(
            "entry version {:#06x}, not the {ENTRY_VERSION:#06x} of the layout Atlas checks",
            entry.version
        ));
    }
    check_sizes(entry)?;
    if string_in_header(header, entry.name_offset, entry.name_size, true).is_none() {
        return Err(format!(
            "its name at offset {} + size {} (at 32) is not a NUL-terminated string inside its \
             {}-byte header, past the first {ENTRY_HEADER_SIZE} bytes",
            entry.name_offset, entry.name_size, entry.header_size
        ));
    }
    let at = entry.options_record;
    if at == 0 {
        return Ok(());
    }
    let record = bytes_at(header, at, OPTIONS_RECORD_SIZE).filter(|_| at >= ENTRY_HEADER_SIZE);
    let Some(record) = record else {
        return Err(format!(
            "its options record at offset {at} (at 20) is not inside its {}-byte header, past \
             the first {ENTRY_HEADER_SIZE} bytes",
            entry.header_size
        ));
    };
    let (offset, size) = (
        u64::from(u32_at(record, 0).unwrap_or(0)),
        u64::from(u32_at(record, 4).unwrap_or(0)),
    );
    // PTX entries hold ptxas options, a command line that the driver reads to its NUL; ELF
    // entries, bytes.
    let text = entry.kind == KIND_PTX;
    if string_in_header(header, offset, size, text).is_none() {
        let what = if text {
            "a NUL-terminated string"
        } else {
            "bytes"
        };
        return Err(format!(
            "its options at offset {offset} + size {size} (the record at {at}) are not {what} \
             inside its {}-byte header, past the first {ENTRY_HEADER_SIZE} bytes",
            entry.header_size
        ));
    }
    Ok(())
}

/// The sizes of a compressed payload (the compressed bytes inside it, an uncompressed size), or
/// none for a plain one.
fn check_sizes(entry: &Entry) -> Check {
    if entry.stored() == Stored::Plain {
        if entry.compressed_size != 0 || entry.uncompressed_size != 0 {
            return Err(format!(
                "an uncompressed entry (flags {:#x}) that declares a compressed size {} and an \
                 uncompressed size {} (at 16 and 56, 0 in uncompressed entries)",
                entry.flags, entry.compressed_size, entry.uncompressed_size
            ));
        }
        return Ok(());
    }
    if entry.compressed_size == 0 || entry.compressed_size > entry.payload_size {
        return Err(format!(
            "compressed size {} does not fit the {}-byte payload",
            entry.compressed_size,
            Size(entry.payload_size)
        ));
    }
    if entry.uncompressed_size == 0 {
        return Err("a compressed payload that declares no uncompressed size".into());
    }
    Ok(())
}

/// The `size` bytes at `offset` of an entry's `header`, when they are none (`0, 0`) or lie in its
/// extension (past the fixed 64 bytes) and, for a `c_string`, a NUL follows them there.
fn string_in_header(header: &[u8], offset: u64, size: u64, c_string: bool) -> Option<&[u8]> {
    if (offset, size) == (0, 0) {
        return Some(&[]);
    }
    if offset < ENTRY_HEADER_SIZE {
        return None;
    }
    if !c_string {
        return bytes_at(header, offset, size);
    }
    let with_nul = bytes_at(header, offset, size.checked_add(1)?)?;
    let (&nul, text) = with_nul.split_last()?;
    (nul == 0).then_some(text)
}
