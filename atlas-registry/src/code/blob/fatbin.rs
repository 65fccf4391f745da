//! NVIDIA fatbins: a container of PTX and cubin entries, one per architecture.
//!
//! Layout (little-endian), read from what CUDA toolchains write: nvcc 13.0's `elementwise.fatbin`
//! (`testdata/nvcc13.0.elementwise.fatbin`), the committed one (`kernels/nvrtc.py` writes it from
//! NVRTC 12.0's PTX and cubins), and what NVIDIA's nvFatbin library (12.9 and 13.5) makes of PTX
//! and cubins with and without names, ptxas options and compression
//! (`testdata/cuda13.elementwise.fatbin`); checked against public descriptions of the format:
//!
//! - header, 16 bytes: `u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 body size`;
//!   the entries follow the header and fill the body exactly.
//! - entry header, 64 bytes, then an extension when `header size` says more:
//!   - `u16 kind` (1 PTX, 2 ELF) at 0, `u16 version` 0x0101 at 2, `u32 header size` at 4,
//!     `u64 payload size` at 8 (padded to 8), `u32 compressed size` at 16 (0 uncompressed);
//!   - `u32 options record` at 20: 0, or the offset in the entry of an 8-byte record `u32
//!     offset, u32 size` of the ptxas options, a NUL-terminated command line in the header
//!     (nvcc and nvFatbin write one for every PTX entry, empty unless options were given), or of
//!     binary data for an ELF entry (nvFatbin 13 writes 40 bytes for sm_100 and later);
//!   - `u16 minor, u16 major` code version at 24, `u32 arch` (90 for sm_90) at 28;
//!   - `u32 name offset, u32 name length` at 32: 0 and 0, or the entry's name (a source file
//!     name) in the header, NUL-terminated;
//!   - `u64 flags` at 40: `0x1` 64-bit, `0x2` debug, `0x4` CUDA, `0x8` OpenCL, `0x10` Linux, `0x20`
//!     Mac, `0x40` Windows, `0x1000`/`0x2000` NVIDIA's own compression, `0x8000` zstd,
//!     `0x100_0000` on nvFatbin 13's sm_100 and later ELF entries;
//!   - `u64` 0 at 48, `u64 uncompressed size` at 56 (0 uncompressed).
//!
//!   The payload follows the header.
//!
//! Measured on an H200 (driver 580): a PTX entry whose name offset, options record offset,
//! options offset or options text (its terminating NUL overwritten) was changed crashed the
//! driver inside `cuModuleLoadData` as it JIT-compiled the entry: the driver follows these
//! offsets, and the crashes fit its reading the strings to their NUL. So names and options are checked to lie inside
//! the entry's header with their NUL, the options to be a printable command line, and every other
//! field of the header to hold what toolchains write there: known flags, a plausible SM number,
//! zeros where they write zeros.
//!
//! # Compressed entries
//!
//! nvcc compresses entries by default when that makes them smaller (nvcc 13.0 zstd-compressed
//! the PTX of `elementwise.fatbin`; the committed fatbin is uncompressed). A compressed payload
//! is checked as a container, not as what it holds: its compressed size fits in the payload, it
//! declares a non-zero uncompressed size, and a zstd payload starts with a zstd frame whose
//! declared content size, when it has one, is that uncompressed size. What it decompresses to is
//! not checked: that would need a decompressor (zstd and NVIDIA's own scheme) in the crate, which
//! is neither small nor something to write here, and refusing compressed entries would refuse
//! what nvcc writes by default. So a corrupt cubin inside a compressed entry still reaches the
//! driver; a corrupt compressed stream is for the driver's decompressor to refuse.

use super::elf::{self, Machines, cuda};
use super::read::{Check, Size, bytes_at, field, u8_at, u16_at, u32_at, u64_at};

/// The fatbin magic, `0xBA55ED50`, as it is stored.
pub(super) const MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
const VERSION: u16 = 1;
const HEADER_SIZE: u64 = 16;
const ENTRY_HEADER_SIZE: u64 = 64;
/// The version of the entry header layout, in every entry toolchains write.
const ENTRY_VERSION: u16 = 0x0101;
/// An options record: `u32 offset, u32 size`.
const OPTIONS_RECORD_SIZE: u64 = 8;

const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;

const FLAG_COMPRESSED_NV: u64 = 0x1000 | 0x2000;
const FLAG_COMPRESSED_ZSTD: u64 = 0x8000;
/// Every flag toolchains set (see the module documentation).
const KNOWN_FLAGS: u64 = 0x1
    | 0x2
    | 0x4
    | 0x8
    | 0x10
    | 0x20
    | 0x40
    | FLAG_COMPRESSED_NV
    | FLAG_COMPRESSED_ZSTD
    | 0x100_0000;

const ZSTD_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();

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
    reserved: u64,
    uncompressed_size: u64,
}

impl Entry {
    fn payload_at(&self) -> u64 {
        self.at + self.header_size
    }

    /// `fatbin entry 1 (ELF sm_90 at offset 560)`, for refusals.
    fn label(&self, index: usize) -> String {
        let kind = match self.kind {
            KIND_PTX => "PTX",
            KIND_ELF => "ELF",
            _ => "unknown kind",
        };
        format!(
            "fatbin entry {index} ({kind} sm_{} at offset {})",
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
            reserved: u64_(48),
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

/// The payloads of the fatbin's uncompressed entries (PTX text or ELF images), in order; nothing
/// past the first malformed entry.
pub(super) fn plain_payloads(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    entries(b)
        .into_iter()
        .flatten()
        .map_while(Result::ok)
        .filter(|entry| entry.flags & (FLAG_COMPRESSED_NV | FLAG_COMPRESSED_ZSTD) == 0)
        .filter_map(move |entry| bytes_at(b, entry.payload_at(), entry.payload_size))
}

/// Checks a fatbin: its header, every entry's header, and what each entry holds.
pub(super) fn check(b: &[u8]) -> Check {
    for (index, entry) in entries(b)?.enumerate() {
        let entry = entry?;
        check_entry(b, &entry).map_err(|e| format!("{}: {e}", entry.label(index)))?;
    }
    Ok(())
}

fn check_entry(b: &[u8], entry: &Entry) -> Check {
    if !matches!(entry.kind, KIND_PTX | KIND_ELF) {
        return Err(format!(
            "kind {} is neither PTX ({KIND_PTX}) nor ELF ({KIND_ELF}), the kinds Atlas can check",
            entry.kind
        ));
    }
    // The whole header and the payload lie inside the fatbin (checked when the entry was read).
    let header = bytes_at(b, entry.at, entry.header_size).unwrap_or_default();
    let payload = bytes_at(b, entry.payload_at(), entry.payload_size).unwrap_or_default();
    check_header(header, entry)?;
    let compression = entry.flags & (FLAG_COMPRESSED_NV | FLAG_COMPRESSED_ZSTD);
    if compression != 0 {
        return check_compressed(payload, entry, compression);
    }
    if entry.compressed_size != 0 || entry.uncompressed_size != 0 {
        return Err(format!(
            "an uncompressed entry (flags {:#x}) that declares a compressed size {} and an \
             uncompressed size {} (at 16 and 56, 0 in uncompressed entries)",
            entry.flags, entry.compressed_size, entry.uncompressed_size
        ));
    }
    match entry.kind {
        KIND_ELF => {
            elf::check(payload, "ELF payload", Machines::Cuda)?;
            match cuda::sm_arch(payload) {
                Some(sm) if sm == entry.arch => Ok(()),
                sm => Err(format!(
                    "the entry is for sm_{}, the cubin in it for {}",
                    entry.arch,
                    sm.map_or_else(|| "no SM its e_flags name".into(), |sm| format!("sm_{sm}"))
                )),
            }
        }
        _ => {
            // PTX is stored NUL-terminated (nvcc's compressed PTX decompresses to text ending
            // in a NUL, the committed fatbin's is stored so) and read as a C string: it must end
            // inside the payload.
            if payload.contains(&0) {
                Ok(())
            } else {
                Err(format!(
                    "the {}-byte PTX payload has no terminating NUL byte",
                    Size(payload.len() as u64)
                ))
            }
        }
    }
}

/// The fields of an entry's header that say nothing about the payload's size: version, flags,
/// architecture, name, options and the zeros. `header` is the whole header, extension included.
fn check_header(header: &[u8], entry: &Entry) -> Check {
    if entry.version != ENTRY_VERSION {
        return Err(format!(
            "entry version {:#06x}, not the {ENTRY_VERSION:#06x} of the layout Atlas checks",
            entry.version
        ));
    }
    let unknown = entry.flags & !KNOWN_FLAGS;
    if unknown != 0 {
        return Err(format!(
            "flags {:#x} have bits {unknown:#x} that no CUDA toolchain sets",
            entry.flags
        ));
    }
    if !cuda::SM_NUMBERS.contains(&entry.arch) {
        return Err(format!(
            "architecture {} (at 28) is not an SM number from {} to {}",
            entry.arch,
            cuda::SM_NUMBERS.start(),
            cuda::SM_NUMBERS.end()
        ));
    }
    if entry.reserved != 0 {
        return Err(format!(
            "the 8 bytes at 48 hold {:#x}, not the 0 toolchains write",
            entry.reserved
        ));
    }
    if (entry.name_offset, entry.name_size) != (0, 0)
        && c_string_in_header(header, entry.name_offset, entry.name_size).is_none()
    {
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
    let options = if entry.kind == KIND_PTX {
        // ptxas options: a command line, read to its NUL.
        c_string_in_header(header, offset, size)
            .filter(|text| text.iter().all(|c| (b' '..=b'~').contains(c)))
    } else {
        bytes_at(header, offset, size).filter(|_| offset >= ENTRY_HEADER_SIZE)
    };
    if options.is_none() {
        let what = if entry.kind == KIND_PTX {
            "a NUL-terminated printable command line"
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

/// The `size` bytes at `offset` of an entry's `header`, when they lie in its extension (past the
/// fixed 64 bytes) and a NUL follows them there.
fn c_string_in_header(header: &[u8], offset: u64, size: u64) -> Option<&[u8]> {
    let with_nul = bytes_at(header, offset, size.checked_add(1)?)?;
    let (&nul, text) = with_nul.split_last()?;
    (offset >= ENTRY_HEADER_SIZE && nul == 0).then_some(text)
}

/// The container checks of a compressed payload (see the module documentation for why no more).
fn check_compressed(payload: &[u8], entry: &Entry, compression: u64) -> Check {
    if !compression.is_power_of_two() {
        return Err(format!(
            "flags {:#x} name more than one compression",
            entry.flags
        ));
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
    if compression == FLAG_COMPRESSED_ZSTD {
        let content = zstd_content_size(payload).ok_or_else(|| {
            "the payload is flagged zstd-compressed but does not start with a zstd frame header"
                .to_string()
        })?;
        if let Some(content) = content
            && content != entry.uncompressed_size
        {
            return Err(format!(
                "the zstd frame holds {} bytes, the entry declares {} uncompressed",
                Size(content),
                Size(entry.uncompressed_size)
            ));
        }
    }
    Ok(())
}

/// The content size a zstd frame header declares (`Some(None)` when it declares none), or
/// `None` when `b` does not start with a well-formed frame header (RFC 8878, 3.1.1.1).
pub(super) fn zstd_content_size(b: &[u8]) -> Option<Option<u64>> {
    if bytes_at(b, 0, 4)? != ZSTD_MAGIC {
        return None;
    }
    let descriptor = u8_at(b, 4)?;
    if descriptor & 0x08 != 0 {
        return None; // the reserved bit
    }
    let single_segment = descriptor & 0x20 != 0;
    let dictionary = match descriptor & 3 {
        0 => 0,
        1 => 1,
        2 => 2,
        _ => 4,
    };
    let content_bytes = match (descriptor >> 6, single_segment) {
        (0, false) => 0,
        (0, true) => 1,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    let at = 5 + u64::from(!single_segment) + dictionary;
    let field = bytes_at(b, at, content_bytes)?;
    let mut value = 0u64;
    for (i, byte) in field.iter().enumerate() {
        value |= u64::from(*byte) << (8 * i);
    }
    Some(match content_bytes {
        0 => None,
        2 => Some(value + 256),
        _ => Some(value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_frame_headers() {
        // nvcc 13.0's compressed PTX entry: single segment, 2-byte content size 0x492 + 256.
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x60, 0x92, 0x04]),
            Some(Some(1426))
        );
        // No content size, a window descriptor.
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50]),
            Some(None)
        );
        // Single segment with a 1-byte size; 4-byte size after a 1-byte dictionary id.
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x07]),
            Some(Some(7))
        );
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0xa1, 0x09, 1, 0, 0, 1]),
            Some(Some(0x0100_0001))
        );
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x60, 0x92]),
            None
        );
        assert_eq!(
            zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x08, 0, 0]),
            None
        );
        assert_eq!(zstd_content_size(b"not zstd"), None);
    }
}
