//! What a blob is (PTX, ELF cubin, fatbin, offload bundle) and checking it before the driver sees it.

use std::borrow::Cow;

use crate::error::{AtlasError, Result};

/// The kind of a module blob, told from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlobKind {
    /// PTX text (UTF-8); handed to the driver NUL-terminated and JIT-compiled.
    Ptx,
    /// An ELF cubin (`\x7fELF`).
    Cubin,
    /// A fatbin (magic `0xBA55ED50`).
    Fatbin,
    /// A clang offload bundle (`__CLANG_OFFLOAD_BUNDLE__`).
    OffloadBundle,
    /// Something else that is not UTF-8; handed to the driver as it is, which decides.
    Binary,
}

const ELF_MAGIC: &[u8] = b"\x7fELF";
const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
/// `e_machine` of CUDA ELF files.
const EM_CUDA: u16 = 190;

/// Tells what `blob` is from its first bytes.
pub fn sniff(blob: &[u8]) -> BlobKind {
    if blob.starts_with(ELF_MAGIC) {
        BlobKind::Cubin
    } else if blob.starts_with(&FATBIN_MAGIC) {
        BlobKind::Fatbin
    } else if blob.starts_with(BUNDLE_MAGIC) {
        BlobKind::OffloadBundle
    } else if std::str::from_utf8(blob).is_ok() {
        BlobKind::Ptx
    } else {
        BlobKind::Binary
    }
}

/// Checks `blob` and returns the bytes to hand to the driver: PTX NUL-terminated, ELF and fatbin
/// headers checked so that every offset they declare lies inside the blob, anything else ending in
/// a NUL so that no reader of the driver's can run past its end.
pub(crate) fn prepare<'b>(module: &str, blob: &'b [u8]) -> Result<(BlobKind, Cow<'b, [u8]>)> {
    let invalid = |reason: String| AtlasError::InvalidModule {
        module: module.escape_debug().to_string(),
        reason,
    };
    if blob.is_empty() {
        return Err(invalid("the blob is empty".into()));
    }
    let kind = sniff(blob);
    match kind {
        BlobKind::Ptx => {
            let text = blob.strip_suffix(b"\0").unwrap_or(blob);
            if let Some(at) = text.iter().position(|&b| b == 0) {
                return Err(invalid(format!(
                    "the PTX text has a NUL byte at offset {at}"
                )));
            }
            if text.len() < blob.len() {
                return Ok((kind, Cow::Borrowed(blob)));
            }
            let mut owned = Vec::with_capacity(blob.len() + 1);
            owned.extend_from_slice(blob);
            owned.push(0);
            Ok((kind, Cow::Owned(owned)))
        }
        BlobKind::Cubin => check_elf(blob)
            .map(|()| (kind, Cow::Borrowed(blob)))
            .map_err(invalid),
        BlobKind::Fatbin => check_fatbin(blob)
            .map(|()| (kind, Cow::Borrowed(blob)))
            .map_err(invalid),
        BlobKind::OffloadBundle | BlobKind::Binary => {
            let mut owned = Vec::with_capacity(blob.len() + 1);
            owned.extend_from_slice(blob);
            owned.push(0);
            Ok((kind, Cow::Owned(owned)))
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// A 64-bit little-endian CUDA ELF whose program and section header tables lie inside the blob.
fn check_elf(b: &[u8]) -> Result<(), String> {
    const HEADER: usize = 64;
    if b.len() < HEADER {
        return Err(format!(
            "truncated ELF cubin: {} bytes, shorter than its 64-byte header",
            b.len()
        ));
    }
    if b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF file, as CUDA cubins are".into());
    }
    if u16_at(b, 18) != u64::from(EM_CUDA) {
        return Err(format!(
            "an ELF file for machine {}, not CUDA ({EM_CUDA})",
            u16_at(b, 18)
        ));
    }
    let len = b.len() as u64;
    for (what, offset, count, entry) in [
        (
            "program header table",
            u64_at(b, 32),
            u16_at(b, 56),
            u16_at(b, 54),
        ),
        (
            "section header table",
            u64_at(b, 40),
            u16_at(b, 60),
            u16_at(b, 58),
        ),
    ] {
        let end = offset.checked_add(count * entry);
        if count > 0 && end.is_none_or(|end| end > len) {
            return Err(format!(
                "truncated ELF cubin: its {what} ends past the blob's {len} bytes"
            ));
        }
    }
    Ok(())
}

/// A fatbin whose header-declared size lies inside the blob, and whose entries (each a header
/// declaring its own size and its payload's) tile that size exactly.
fn check_fatbin(b: &[u8]) -> Result<(), String> {
    const HEADER: usize = 16;
    /// The fixed part of an entry header: kind, version, header size, payload size, and the
    /// fields after them that the driver reads.
    const ENTRY_HEADER: u64 = 64;
    if b.len() < HEADER {
        return Err(format!(
            "truncated fatbin: {} bytes, shorter than its 16-byte header",
            b.len()
        ));
    }
    let header_size = u16_at(b, 6);
    let body = u64_at(b, 8);
    let end = header_size.checked_add(body);
    let end = match end {
        Some(end) if header_size >= HEADER as u64 && end <= b.len() as u64 => end,
        _ => {
            return Err(format!(
                "truncated fatbin: its header declares {header_size} + {body} bytes, the blob has {}",
                b.len()
            ));
        }
    };
    if body == 0 {
        return Err("the fatbin has no entries".into());
    }
    let mut at = header_size;
    while at < end {
        if end - at < ENTRY_HEADER {
            return Err(format!(
                "truncated fatbin: the entry at offset {at} has no room for its {ENTRY_HEADER}-byte header"
            ));
        }
        let entry_header = u32_at(b, at as usize + 4);
        let payload = u64_at(b, at as usize + 8);
        let next = entry_header
            .checked_add(payload)
            .and_then(|n| n.checked_add(at));
        match next {
            Some(next) if entry_header >= ENTRY_HEADER && next <= end => at = next,
            _ => {
                return Err(format!(
                    "malformed fatbin: the entry at offset {at} declares a {entry_header}-byte header and a {payload}-byte payload; the fatbin ends at {end}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[..4].copy_from_slice(ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b
    }

    #[test]
    fn sniffs_every_kind() {
        assert_eq!(sniff(b".version 8.0\n.target sm_90\n"), BlobKind::Ptx);
        assert_eq!(sniff(&elf(EM_CUDA, 64)), BlobKind::Cubin);
        assert_eq!(
            sniff(&[0x50, 0xED, 0x55, 0xBA, 1, 0, 16, 0]),
            BlobKind::Fatbin
        );
        assert_eq!(
            sniff(b"__CLANG_OFFLOAD_BUNDLE____\x00\xff"),
            BlobKind::OffloadBundle
        );
        assert_eq!(sniff(&[0xff, 0xfe, 0x00, 0x80]), BlobKind::Binary);
    }

    #[test]
    fn ptx_is_nul_terminated_once() {
        let (_, owned) = prepare("m", b".version 8.0").unwrap();
        assert_eq!(&*owned, b".version 8.0\0");
        assert!(matches!(owned, Cow::Owned(_)));
        let (_, borrowed) = prepare("m", b".version 8.0\0").unwrap();
        assert!(matches!(borrowed, Cow::Borrowed(_)));
    }

    #[test]
    fn rejects_empty_and_interior_nul_naming_the_module() {
        let e = prepare("my_mod", b"").unwrap_err().to_string();
        assert!(e.contains("my_mod") && e.contains("empty"), "{e}");
        let e = prepare("my_mod", b".version\0 8.0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("my_mod") && e.contains("offset 8"), "{e}");
    }

    #[test]
    fn elf_headers_must_fit() {
        assert!(prepare("m", &elf(EM_CUDA, 64)).is_ok());
        assert!(
            prepare("m", &elf(EM_CUDA, 40))
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        assert!(
            prepare("m", &elf(62, 64))
                .unwrap_err()
                .to_string()
                .contains("machine 62")
        );
        let mut b = elf(EM_CUDA, 64);
        b[40..48].copy_from_slice(&1000u64.to_le_bytes()); // section headers at 1000
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&3u16.to_le_bytes());
        assert!(
            prepare("m", &b)
                .unwrap_err()
                .to_string()
                .contains("section header table")
        );
        b[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(prepare("m", &b).is_err());
    }

    #[test]
    fn fatbin_size_must_fit() {
        // One entry: a 64-byte header declaring itself and an 8-byte payload.
        let mut b = vec![0x50, 0xED, 0x55, 0xBA, 1, 0, 16, 0];
        b.extend_from_slice(&72u64.to_le_bytes());
        let mut entry = vec![0u8; 64];
        entry[0] = 2;
        entry[4..8].copy_from_slice(&64u32.to_le_bytes());
        entry[8..16].copy_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&entry);
        b.extend_from_slice(&[0; 8]);
        assert!(prepare("m", &b).is_ok());
        b[24..32].copy_from_slice(&9u64.to_le_bytes()); // the payload runs past the end
        assert!(
            prepare("m", &b)
                .unwrap_err()
                .to_string()
                .contains("malformed fatbin")
        );
        b[24..32].copy_from_slice(&8u64.to_le_bytes());
        b[8..16].copy_from_slice(&73u64.to_le_bytes());
        assert!(
            prepare("m", &b)
                .unwrap_err()
                .to_string()
                .contains("truncated fatbin")
        );
        assert!(prepare("m", &b[..10]).is_err());
    }

    #[test]
    fn other_binaries_get_a_terminating_nul() {
        let (kind, bytes) = prepare("m", &[0xff, 0xfe]).unwrap();
        assert_eq!(kind, BlobKind::Binary);
        assert_eq!(&*bytes, &[0xff, 0xfe, 0]);
    }
}
