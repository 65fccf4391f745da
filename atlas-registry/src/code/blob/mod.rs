//! What a blob is (PTX, ELF, fatbin, offload bundle), and checking its structure before the driver
//! sees it.
//!
//! The driver is not hardened against malformed images: a cubin with one byte changed in its
//! section header table or symbol table can crash the process inside `cuModuleLoadData`. So every
//! blob is checked here first, without the driver, and refused with
//! [`AtlasError::InvalidModule`] naming the structure that is wrong:
//!
//! - PTX: no NUL byte before its end; handed over NUL-terminated.
//! - ELF (NVIDIA cubins, AMD GPU code objects): the structure every ELF reader follows
//!   ([`elf`]), and NVIDIA's own sections of a cubin ([`elf::cuda`]).
//! - Fatbins: the header, every entry inside the body and every field of its header as toolchains
//!   write it (names and ptxas options inside the header), each entry's ELF or PTX checked as
//!   above ([`fatbin`]; compressed entries are checked as containers only, see there).
//! - Clang offload bundles: the entry table, every entry's id and code object inside the blob,
//!   each ELF code object checked as above ([`bundle`]).
//!
//! Everything offsets and sizes point at is read with checked arithmetic and checked reads; no
//! input makes the checks panic or allocate, except the message of a refusal. They run on every
//! load, so they are written to take few steps: one pass over a cubin's sections, each field read
//! where it is used, refusals formatted by cold functions on the way out. A 4.5 KiB cubin with two
//! kernels takes about 3,100 instructions, a quarter to half a microsecond
//! (`cargo run --release -p atlas-registry --example validate_blobs`).

mod bundle;
mod elf;
mod fatbin;
mod read;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::error::{AtlasError, Result};
use read::Check;

pub(crate) use elf::cuda::sm_arch;

/// The kind of a module blob, told from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlobKind {
    /// PTX text (UTF-8); handed to the driver NUL-terminated and JIT-compiled.
    Ptx,
    /// An ELF file (`\x7fELF`): an NVIDIA cubin, or an AMD GPU code object (SCALE/HIP).
    Cubin,
    /// A fatbin (magic `0xBA55ED50`).
    Fatbin,
    /// A clang offload bundle (`__CLANG_OFFLOAD_BUNDLE__`).
    OffloadBundle,
    /// Something else that is not UTF-8; handed to the driver as it is, which decides.
    Binary,
}

/// Tells what `blob` is from its first bytes.
pub fn sniff(blob: &[u8]) -> BlobKind {
    if blob.starts_with(elf::MAGIC) {
        BlobKind::Cubin
    } else if blob.starts_with(&fatbin::MAGIC) {
        BlobKind::Fatbin
    } else if blob.starts_with(bundle::MAGIC) {
        BlobKind::OffloadBundle
    } else if std::str::from_utf8(blob).is_ok() {
        BlobKind::Ptx
    } else {
        BlobKind::Binary
    }
}

/// Checks the structure of module `module`'s blob as [`AtlasRegistry::load`] does before handing
/// it to the driver, without a driver or a GPU, and says what kind of blob it is.
///
/// A blob that passes has no offset, size or index that points outside it or at the wrong thing
/// (see [`BlobKind`] for the kinds; ELF headers, section and program header tables, string
/// tables, symbols, relocations, notes, NVIDIA's `.nv.info` attribute records, fatbin and
/// offload-bundle entries); whether the code in it is right is for the driver to say when it
/// loads it. A blob that fails is an [`AtlasError::InvalidModule`] naming `module` and the
/// structure at fault, e.g. "section 7 (.nv.info.scale): offset 4500 + size 88 is past the end of
/// the 4,584-byte blob (truncated or corrupt)".
///
/// [`AtlasRegistry::load`]: crate::AtlasRegistry::load
///
/// ```
/// use atlas_registry::{BlobKind, validate_blob};
///
/// let (name, cubin) = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0];
/// assert_eq!(validate_blob(name, cubin).unwrap(), BlobKind::Cubin);
/// let e = validate_blob(name, &cubin[..cubin.len() / 2]).unwrap_err();
/// assert!(e.to_string().contains("truncated"), "{e}");
/// ```
pub fn validate_blob(module: &str, blob: &[u8]) -> Result<BlobKind> {
    check(blob).map_err(|reason| AtlasError::InvalidModule {
        module: module.escape_debug().to_string(),
        reason,
    })
}

fn check(blob: &[u8]) -> Check<BlobKind> {
    if blob.is_empty() {
        return Err("the blob is empty".into());
    }
    let kind = sniff(blob);
    match kind {
        BlobKind::Ptx => check_ptx(blob)?,
        BlobKind::Cubin => elf::check(blob, "blob", elf::Machines::Gpu)?,
        BlobKind::Fatbin => fatbin::check(blob)?,
        BlobKind::OffloadBundle => bundle::check(blob)?,
        BlobKind::Binary => {}
    }
    Ok(kind)
}

/// PTX is handed over as a C string: a NUL byte may only end it.
fn check_ptx(blob: &[u8]) -> Check {
    let text = blob.strip_suffix(b"\0").unwrap_or(blob);
    // `contains` on bytes is the word-at-a-time search; the position only on the way out.
    if !text.contains(&0) {
        return Ok(());
    }
    let at = text.iter().position(|&b| b == 0).unwrap_or_default();
    Err(format!("the PTX text has a NUL byte at offset {at}"))
}

/// Checks `blob` (as [`validate_blob`]) and returns the bytes to hand to the driver: the blob
/// itself, except PTX without its terminating NUL and unknown binaries, which get one (copied), so
/// that no reader of the driver's can run past their end.
pub(crate) fn prepare<'b>(module: &str, blob: &'b [u8]) -> Result<(BlobKind, Cow<'b, [u8]>)> {
    let kind = validate_blob(module, blob)?;
    let terminated = matches!(kind, BlobKind::Ptx | BlobKind::Binary) && !blob.ends_with(b"\0");
    if !terminated {
        return Ok((kind, Cow::Borrowed(blob)));
    }
    let mut owned = Vec::with_capacity(blob.len() + 1);
    owned.extend_from_slice(blob);
    owned.push(0);
    Ok((kind, Cow::Owned(owned)))
}

/// The code a blob holds that a reader can parse on its own: the blob itself, or for a fatbin the
/// payload of each uncompressed entry (PTX text or an ELF image).
pub(crate) fn plain_code(blob: &[u8]) -> Vec<&[u8]> {
    match sniff(blob) {
        BlobKind::Fatbin => fatbin::plain_payloads(blob).collect(),
        _ => vec![blob],
    }
}

/// What code `blob` holds, for messages: `sm_90 SASS` for a cubin, `sm_90 SASS, compute_90 PTX`
/// for a fatbin, `PTX for sm_75`. Reads only what is there; never fails.
pub(crate) fn code_targets(blob: &[u8]) -> String {
    match sniff(blob) {
        BlobKind::Cubin => match sm_arch(blob) {
            Some(sm) => format!("sm_{sm} SASS"),
            None if read::u16_at(blob, 18) == Some(object::elf::EM_AMDGPU) => {
                "an AMD GPU code object".into()
            }
            None => "an ELF file of unknown architecture".into(),
        },
        BlobKind::Fatbin => {
            let targets: Vec<String> = fatbin::entries(blob)
                .into_iter()
                .flatten()
                .map_while(|entry| entry.ok())
                .map(|entry| match entry.kind {
                    1 => format!("compute_{} PTX", entry.arch),
                    _ => format!("sm_{} SASS", entry.arch),
                })
                .collect();
            if targets.is_empty() {
                "a fatbin without readable entries".into()
            } else {
                targets.join(", ")
            }
        }
        BlobKind::Ptx => String::from_utf8_lossy(blob)
            .lines()
            .find_map(|line| line.trim_start().strip_prefix(".target"))
            .and_then(|rest| rest.split([',', ' ', '\t']).find(|t| !t.is_empty()))
            .map_or_else(
                || "PTX without a .target".into(),
                |target| format!("PTX for {target}"),
            ),
        BlobKind::OffloadBundle => "a clang offload bundle".into(),
        BlobKind::Binary => "an unknown binary".into(),
    }
}
