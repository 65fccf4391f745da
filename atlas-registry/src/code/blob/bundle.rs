//! Clang offload bundles: code objects for several targets in one blob (the SCALE/HIP toolchain
//! hands these to `cuModuleLoadData`).
//!
//! Layout (clang's `clang-offload-bundler` documentation), little-endian: the 24-byte magic
//! `__CLANG_OFFLOAD_BUNDLE__`, `u64` entry count, then per entry `u64 offset, u64 size,
//! u64 id length` and the id (`hipv4-amdgcn-amd-amdhsa--gfx90a`, not NUL-terminated); offsets are
//! from the start of the blob. Every entry's id and code object must lie inside the blob, and a
//! code object that is an ELF file is checked as one. (Compressed bundles have another magic,
//! `CCOB`, and are not sniffed as bundles.)

use super::elf::{self, Machines};
use super::read::{Check, Size, bytes_at, past_end, u64_at};

/// The first bytes of an uncompressed clang offload bundle.
pub(super) const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Offset, size and id length.
const ENTRY_FIXED_SIZE: u64 = 24;
/// How much of an entry id a refusal shows: real ids are target triples, shorter than this.
const SHOWN_ID_BYTES: usize = 80;

/// Checks an offload bundle: its entry table and every entry's id and code object.
pub(super) fn check(b: &[u8]) -> Check {
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
    let table = count_at + 8;
    // Each entry takes at least its fixed fields: a count beyond that cannot be right, and
    // checking it first bounds the loop by the blob's size.
    if count > len.saturating_sub(table) / ENTRY_FIXED_SIZE {
        return Err(format!(
            "truncated offload bundle: {count} entries do not fit in the {}-byte blob",
            Size(len)
        ));
    }
    let mut at = table;
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
        let what = || {
            format!(
                "offload bundle entry {index} ({})",
                String::from_utf8_lossy(id.get(..SHOWN_ID_BYTES).unwrap_or(id))
            )
        };
        let code = bytes_at(b, offset, size)
            .ok_or_else(|| past_end(&what(), offset, size, b.len(), "blob"))?;
        if code.starts_with(elf::MAGIC) {
            elf::check(code, "code object", Machines::Gpu)
                .map_err(|e| format!("{}: {e}", what()))?;
        }
        at = id_at + id_size;
    }
    Ok(())
}
