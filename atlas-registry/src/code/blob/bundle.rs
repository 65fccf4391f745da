//! Clang offload bundles: code objects for several targets in one blob (the SCALE/HIP toolchain
//! hands these to `cuModuleLoadData`), plain or compressed.
//!
//! Layout (clang's `clang-offload-bundler` documentation and LLVM's `OffloadBundle.cpp`),
//! little-endian:
//!
//! - plain: the 24-byte magic `__CLANG_OFFLOAD_BUNDLE__`, `u64` entry count, then per entry `u64
//!   offset, u64 size, u64 id length` and the id (`hipv4-amdgcn-amd-amdhsa--gfx90a`, not
//!   NUL-terminated); offsets are from the start of the blob.
//! - compressed: the magic `CCOB`, `u16 version`, `u16 method` (0 zlib, 1 zstd), then by version:
//!   1: `u32 uncompressed size, u64 hash` (20 bytes in all; the compressed bytes run to the end of
//!   the blob); 2: `u32 total size, u32 uncompressed size, u64 hash` (24); 3: `u64 total size, u64
//!   uncompressed size, u64 hash` (32); the compressed bytes run to the total size. They
//!   decompress to a plain bundle.
//!
//! Every entry's id and code object must lie inside the bundle, and a code object that is an ELF
//! file for a GPU is checked as one; an ELF file for another machine (a host object) is not code
//! for the driver. Code objects do not overlap: clang's bundler writes each after the other, and
//! one code object shared by many entries would be checked once per entry (a 1.85 MB bundle of
//! 32,000 entries took seconds), so overlapping ones are refused. A compressed bundle is
//! decompressed with the decompressor of fatbin entries, bounded by its uncompressed size, and
//! what comes out is checked as a plain bundle; zstd is what clang writes when it has it, zlib
//! (without zstd) is refused as a compression Atlas does not read.

use super::compressed::{self, Holds, Scheme};
use super::elf::{self, Machines};
use super::read::{
    Check, Refusal, Refused, Size, bytes_at, overlapping, past_end, u16_at, u32_at, u64_at,
};

/// The first bytes of a plain clang offload bundle.
pub(super) const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
/// The first bytes of a compressed one.
pub(super) const COMPRESSED_MAGIC: &[u8] = b"CCOB";
/// Offset, size and id length.
const ENTRY_FIXED_SIZE: u64 = 24;
/// How much of an entry id a refusal shows: real ids are target triples, shorter than this.
const SHOWN_ID_BYTES: usize = 80;
/// The compression methods of compressed bundles (LLVM's `compression::Format`).
const METHOD_ZLIB: u16 = 0;
const METHOD_ZSTD: u16 = 1;

/// Checks an offload bundle, plain or compressed.
pub(super) fn check(b: &[u8]) -> Refused {
    if b.starts_with(COMPRESSED_MAGIC) {
        let mut plain = Vec::new();
        decompress(b, &mut plain)?;
        if !plain.starts_with(MAGIC) {
            return Err(Refusal::from(
                "the compressed offload bundle does not decompress to an offload bundle".to_owned(),
            ));
        }
        return Ok(
            check_plain(&plain).map_err(|e| format!("in the compressed offload bundle: {e}"))?
        );
    }
    Ok(check_plain(b)?)
}

/// Decompresses the compressed bundle `b` into `plain`.
fn decompress(b: &[u8], plain: &mut Vec<u8>) -> Refused {
    let len = b.len() as u64;
    let (Some(version), Some(method)) = (u16_at(b, 4), u16_at(b, 6)) else {
        return Err(truncated(len).into());
    };
    let (header, total, uncompressed) = match version {
        1 => (20, Some(len), u32_at(b, 8).map(u64::from)),
        2 => (
            24,
            u32_at(b, 8).map(u64::from),
            u32_at(b, 12).map(u64::from),
        ),
        3 => (32, u64_at(b, 8), u64_at(b, 16)),
        _ => {
            return Err(format!(
                "compressed offload bundle version {version}; Atlas reads versions 1 to 3"
            )
            .into());
        }
    };
    let (Some(total), Some(uncompressed)) = (total, uncompressed) else {
        return Err(truncated(len).into());
    };
    if len < header {
        return Err(truncated(len).into());
    }
    let stream = bytes_at(b, header, total.saturating_sub(header))
        .filter(|_| total >= header)
        .ok_or_else(|| {
            format!(
                "truncated compressed offload bundle: it declares {} bytes in all, the blob has {}",
                Size(total),
                Size(len)
            )
        })?;
    match method {
        METHOD_ZSTD => {
            compressed::decompress(Scheme::Zstd, stream, uncompressed, Holds::Other, plain)
                .map_err(|e| e.within("the compressed offload bundle"))
        }
        METHOD_ZLIB => Err(Refusal::from(
            "a zlib-compressed offload bundle: Atlas reads zstd-compressed ones (what clang \
             writes when built with zstd), so the code in it cannot be checked"
                .to_owned(),
        )),
        other => Err(format!(
            "compressed offload bundle method {other}, neither zlib ({METHOD_ZLIB}) nor zstd \
             ({METHOD_ZSTD})"
        )
        .into()),
    }
}

#[cold]
fn truncated(len: u64) -> String {
    format!(
        "truncated compressed offload bundle: {} bytes, too short for its header",
        Size(len)
    )
}

/// Checks a plain offload bundle: its entry table and every entry's id and code object.
fn check_plain(b: &[u8]) -> Check {
    let len = b.len() as u64;
    let count_at = MAGIC.len() as u64;
    let count = u64_at(b, count_at).ok_or_else(|| {
        format!(
            "truncated offload bundle: {} bytes, too short for its entry count",
            Size(len)
        )
    })?;
    if count == 0 {
        return Err("the offload bundle has no entries".into());
    }
    let table_at = count_at + 8;
    // Each entry takes at least its fixed fields: a count beyond that cannot be right, and
    // checking it first bounds the loop by the blob's size.
    if count > len.saturating_sub(table_at) / ENTRY_FIXED_SIZE {
        return Err(format!(
            "truncated offload bundle: {count} entries do not fit in the {}-byte blob",
            Size(len)
        ));
    }
    let mut at = table_at;
    for index in 0..count {
        let fixed = bytes_at(b, at, ENTRY_FIXED_SIZE).ok_or_else(|| {
            past_end(
                &format!("offload bundle entry {index}: its header"),
                at,
                ENTRY_FIXED_SIZE,
                b.len(),
                "blob",
            )
        })?;
        // Three whole words (`fixed` is 24 bytes).
        let offset = u64_at(fixed, 0).unwrap_or(0);
        let size = u64_at(fixed, 8).unwrap_or(0);
        let id_size = u64_at(fixed, 16).unwrap_or(0);
        let id_at = at + ENTRY_FIXED_SIZE;
        let id = bytes_at(b, id_at, id_size).ok_or_else(|| {
            past_end(
                &format!("offload bundle entry {index}: its id"),
                id_at,
                id_size,
                b.len(),
                "blob",
            )
        })?;
        if id.is_empty() || !id.iter().all(u8::is_ascii_graphic) {
            return Err(format!(
                "offload bundle entry {index}: its {}-byte id {:?} is not a target name",
                Size(id_size),
                String::from_utf8_lossy(id.get(..SHOWN_ID_BYTES).unwrap_or(id))
            ));
        }
        if bytes_at(b, offset, size).is_none() {
            return Err(past_end(&label(index, id), offset, size, b.len(), "blob"));
        }
        at = id_at + id_size;
    }
    // Before any code object is read: each is read once.
    let code_objects = table(b, count).map(|entry| (entry.offset, entry.size));
    if let Some((first, second)) = overlapping(code_objects) {
        return Err(format!(
            "offload bundle entries {first} and {second} share bytes of their code objects; \
             clang writes each code object on its own"
        ));
    }
    for entry in table(b, count) {
        // Inside the blob (checked above).
        let code = bytes_at(b, entry.offset, entry.size).unwrap_or_default();
        if elf::is_gpu_elf(code) {
            elf::check(code, "code object", Machines::Gpu)
                .map_err(|e| format!("{}: {e}", label(entry.index, entry.id)))?;
        }
    }
    Ok(())
}

/// `offload bundle entry 1 (hipv4-amdgcn-amd-amdhsa--gfx90a)`, for refusals.
fn label(index: u64, id: &[u8]) -> String {
    format!(
        "offload bundle entry {index} ({})",
        String::from_utf8_lossy(id.get(..SHOWN_ID_BYTES).unwrap_or(id))
    )
}

/// An entry of a bundle's table.
#[derive(Clone, Copy)]
struct TableEntry<'a> {
    index: u64,
    offset: u64,
    size: u64,
    id: &'a [u8],
}

/// The `count` entries of the table of plain bundle `b`, which has been checked.
fn table(b: &[u8], count: u64) -> impl Iterator<Item = TableEntry<'_>> + Clone {
    let mut at = MAGIC.len() as u64 + 8;
    (0..count).map(move |index| {
        let id_size = u64_at(b, at + 16).unwrap_or(0);
        let entry = TableEntry {
            index,
            offset: u64_at(b, at).unwrap_or(0),
            size: u64_at(b, at + 8).unwrap_or(0),
            id: bytes_at(b, at + ENTRY_FIXED_SIZE, id_size).unwrap_or_default(),
        };
        at += ENTRY_FIXED_SIZE + id_size;
        entry
    })
}
