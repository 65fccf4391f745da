//! What a blob is (PTX, ELF, fatbin, offload bundle), and checking its structure before the driver
//! sees it.
//!
//! The driver is not hardened against malformed images: a cubin with one byte changed in its
//! section header table or symbol table can crash the process inside `cuModuleLoadData`. So every
//! blob is checked here first, without the driver, and refused with
//! [`AtlasError::InvalidModule`] naming the structure that is wrong. The policy, each rule with
//! its reason, is in `RELIABILITY.md` ("Blob validation"): strict on structure, permissive on
//! meaning, every byte the driver parses checked, every format known and the rest refused, in
//! linear time.
//!
//! - PTX ([`ptx`]): UTF-8 text that starts with a `.version` directive, no NUL byte before its
//!   end; handed over NUL-terminated.
//! - ELF (NVIDIA cubins, AMD GPU code objects): the structure every ELF reader follows
//!   ([`elf`]), and NVIDIA's own sections of a cubin ([`elf::cuda`]).
//! - Fatbins ([`fatbin`]): the header and every entry's header; the code of every entry the
//!   driver may pick for the device (or, without a device, for any device), checked as above,
//!   compressed entries decompressed first ([`compressed`]).
//! - Clang offload bundles, plain or compressed ([`bundle`]): the entry table, every entry's id
//!   and code object inside the blob, each ELF code object checked as above.
//!
//! Anything else is refused, naming the formats Atlas takes; handing the driver bytes of another
//! format is an explicit `unsafe` opt-in
//! ([`AtlasRegistry::load_with_unknown_formats`](crate::AtlasRegistry::load_with_unknown_formats)).
//!
//! Everything offsets and sizes point at is read with checked arithmetic and checked reads; no
//! input makes the checks panic, and they allocate only to decompress (at most
//! [`UNCOMPRESSED_LIMIT`] at a time, see [`validate_blob`]), to sort the sections of an ELF file
//! whose table is not in file order, and for the message of a refusal. They run on
//! every load, so they are written to take few steps: one pass over a cubin's sections, each
//! field read where it is used, refusals formatted by cold functions on the way out. A 4.5 KiB
//! cubin with two kernels takes about 3,100 instructions, a quarter to half a microsecond
//! (`cargo run --release -p atlas-registry --example validate_blobs`).

mod bundle;
mod compressed;
pub(in crate::code) mod elf;
pub(in crate::code) mod fatbin;
pub(in crate::code) mod ptx;
mod read;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::code::target::{Code, Devices, jit_forced};
use crate::error::{AtlasError, Result};
use read::{Refusal, Refused};

pub use compressed::UNCOMPRESSED_LIMIT;

#[cfg(test)]
pub(crate) use compressed::DECOMPRESSIONS;
pub(crate) use elf::cuda::{cubin_arch, sm_arch};

/// The formats Atlas takes, for refusals of anything else.
const FORMATS: &str = "PTX, NVIDIA ELF cubins, AMD GPU ELF code objects, NVIDIA fatbins and clang \
                       offload bundles (plain or compressed)";

/// The kind of a module blob, told from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlobKind {
    /// UTF-8 text: PTX when it starts with a `.version` directive (after whitespace and comments),
    /// as validation requires; handed to the driver NUL-terminated and JIT-compiled.
    Ptx,
    /// An ELF file (`\x7fELF`): an NVIDIA cubin, or an AMD GPU code object (SCALE/HIP).
    Cubin,
    /// A fatbin (magic `0xBA55ED50`).
    Fatbin,
    /// A clang offload bundle (`__CLANG_OFFLOAD_BUNDLE__`, or `CCOB` compressed).
    OffloadBundle,
    /// Something else: bytes of no format Atlas knows. [`validate_blob`] refuses them; only
    /// [`AtlasRegistry::load_with_unknown_formats`](crate::AtlasRegistry::load_with_unknown_formats)
    /// hands them to the driver.
    Binary,
}

/// Tells what `blob` is from its first bytes: a magic number, else UTF-8 text ([`BlobKind::Ptx`]),
/// else [`BlobKind::Binary`]. Whether text is PTX, and anything past the first bytes, is for
/// [`validate_blob`] to say.
pub fn sniff(blob: &[u8]) -> BlobKind {
    match magic(blob) {
        Some(kind) => kind,
        None if std::str::from_utf8(blob).is_ok() => BlobKind::Ptx,
        None => BlobKind::Binary,
    }
}

/// The kind `blob`'s magic number says, if it has one.
fn magic(blob: &[u8]) -> Option<BlobKind> {
    if blob.starts_with(elf::MAGIC) {
        Some(BlobKind::Cubin)
    } else if blob.starts_with(&fatbin::MAGIC) {
        Some(BlobKind::Fatbin)
    } else if blob.starts_with(bundle::MAGIC) || blob.starts_with(bundle::COMPRESSED_MAGIC) {
        Some(BlobKind::OffloadBundle)
    } else {
        None
    }
}

/// Checks the structure of module `module`'s blob as [`AtlasRegistry::load`] does before handing
/// it to the driver, without a driver or a GPU, for any device, and says what kind of blob it is.
///
/// A blob that passes has no offset, size or index that points outside it or at the wrong thing
/// (see [`BlobKind`] for the kinds; ELF headers, section and program header tables, string
/// tables, symbols, relocations, notes, NVIDIA's `.nv.info` attribute records, fatbin and
/// offload-bundle entries, and the code inside compressed entries); whether the code in it is
/// right is for the driver to say when it loads it. Flag bits, versions and architectures are
/// the driver's to judge too: an entry of a fatbin that no device can pick is checked only for
/// its header. A blob that fails is an [`AtlasError::InvalidModule`] naming `module` and the
/// structure at fault, e.g. "section 7 (.nv.info.scale): offset 4500 + size 88 is past the end of
/// the 4,584-byte blob (truncated or corrupt)"; bytes of no format Atlas knows are refused too.
///
/// This checks every entry of a fatbin that some device may pick; a load checks only those its
/// device may pick ([`validate_blob_for_device`]), so a blob that passes here passes there for
/// every device.
///
/// # Memory
///
/// Checking is meant for blobs nobody vouches for, so what it allocates is bounded: the code of
/// a compressed piece it reads (a fatbin entry, a compressed offload bundle), decompressed, one
/// piece at a time and at most [`UNCOMPRESSED_LIMIT`] (256 MiB) of it; 24 bytes per section to
/// sort the sections of an ELF file whose section table is not in file order (at most 3/8 of the
/// file); the text of a refusal. A piece that declares more than the limit is refused with
/// [`AtlasError::TooLargeToCheck`] before anything is decompressed; a compressed cubin that
/// declares more bytes than its own headers describe is refused after only the start that holds
/// them is decompressed, so code followed by gigabytes of zeros costs the code. The largest piece
/// in NVIDIA's CUDA 12 and 13 libraries (cuBLAS, cuBLASLt, cuFFT, cuSPARSE) is a 60 MB PTX entry,
/// a quarter of the limit. zstd's own decoder context (about 100 KiB a thread) comes on top.
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
    refused(module, check(blob, Some(Devices::Every)))
}

/// Checks module `module`'s blob exactly as [`AtlasRegistry::load`] does for a device of compute
/// capability `compute_capability` (`(9, 0)` for an H200), without a driver or a GPU: as
/// [`validate_blob`], except that of a fatbin's entries only those the driver may pick for that
/// device have their code checked: SASS of the device's major version and the same or an older
/// minor one, and PTX for it or an older architecture (whichever the driver prefers, and under
/// `CUDA_FORCE_PTX_JIT`), but architecture-specific ("a") code only of exactly that compute
/// capability and family ("f") PTX only of its major version, as the entries' flags say. So a
/// load's refusal is reproduced here, on any machine.
///
/// When the fatbin holds SASS of exactly the device's architecture in one entry (an executable
/// cubin, no other SASS the device may load, "a" SASS of another compute capability being none
/// it may load; every entry of a kind Atlas knows) and neither
/// `CUDA_FORCE_PTX_JIT` nor `CUDA_FORCE_JIT` is set, that SASS is what the driver loads: only its
/// code is checked, and [`AtlasRegistry::load`] hands the driver that cubin in place of the
/// fatbin, so the driver parses nothing else of it (and decompresses nothing twice).
///
/// Checking only those saves real time on the fatbins of large libraries, which hold code for a
/// dozen architectures, most of it compressed.
///
/// [`AtlasRegistry::load`]: crate::AtlasRegistry::load
///
/// ```
/// use atlas_registry::{BlobKind, validate_blob_for_device};
///
/// let fatbin = atlas_kernels::ELEMENTWISE_FATBIN;
/// assert_eq!(validate_blob_for_device("elementwise", fatbin, (9, 0)).unwrap(), BlobKind::Fatbin);
/// ```
pub fn validate_blob_for_device(
    module: &str,
    blob: &[u8],
    compute_capability: (u32, u32),
) -> Result<BlobKind> {
    let kind = refused(module, check(blob, None))?;
    check_for_device(module, kind, blob, compute_capability, true, |_, _, _| {})?;
    Ok(kind)
}

fn refused<T>(module: &str, check: Refused<T>) -> Result<T> {
    check.map_err(|refusal| {
        let module = module.escape_debug().to_string();
        match refusal {
            Refusal::Malformed(reason) => AtlasError::InvalidModule { module, reason },
            Refusal::TooLarge { what, declared } => AtlasError::TooLargeToCheck {
                module,
                entry: what,
                declared,
                limit: UNCOMPRESSED_LIMIT,
            },
        }
    })
}

/// What `blob` is when it is of a format Atlas knows: [`sniff`]'s kind, except that text is PTX
/// only when it starts as PTX does, and `Binary` is no format.
fn known(blob: &[u8]) -> Option<BlobKind> {
    magic(blob).or_else(|| {
        let text = std::str::from_utf8(blob).ok()?;
        ptx::starts_as_ptx(text).then_some(BlobKind::Ptx)
    })
}

/// Checks `blob`, and of a fatbin the code of the entries that `devices` may pick (`None`: of
/// none, only the headers).
fn check(blob: &[u8], devices: Option<Devices>) -> Refused<BlobKind> {
    check_known(blob, known(blob), devices)
}

/// [`check`], of a blob that is of `kind` ([`known`]'s answer).
fn check_known(blob: &[u8], kind: Option<BlobKind>, devices: Option<Devices>) -> Refused<BlobKind> {
    if blob.is_empty() {
        return Err(Refusal::from("the blob is empty".to_owned()));
    }
    let Some(kind) = kind else {
        return Err(unknown_format(blob).into());
    };
    match kind {
        // `known` found it UTF-8 and starting as PTX does.
        BlobKind::Ptx => ptx::check_nul(blob.strip_suffix(b"\0").unwrap_or(blob))?,
        BlobKind::Cubin => elf::check(blob, "blob", elf::Machines::Gpu)?,
        BlobKind::Fatbin => fatbin::check(blob, devices)?,
        BlobKind::OffloadBundle => bundle::check(blob)?,
        BlobKind::Binary => return Err(unknown_format(blob).into()),
    }
    Ok(kind)
}

/// The refusal of `blob`, of no format Atlas knows.
#[cold]
fn unknown_format(blob: &[u8]) -> String {
    match sniff(blob) {
        BlobKind::Ptx => ptx::check(blob.strip_suffix(b"\0").unwrap_or(blob))
            .err()
            .unwrap_or_else(|| format!("not a format Atlas knows; Atlas takes {FORMATS}")),
        _ => {
            let shown = blob.get(..8).unwrap_or(blob);
            format!(
                "the blob (starting {shown:02x?}) is of no format Atlas knows; Atlas takes \
                 {FORMATS}"
            )
        }
    }
}

/// Checks `blob` before the driver is loaded (so a bad blob is refused the same on a machine
/// without a GPU) and returns its kind and the bytes to hand to the driver: the blob itself,
/// except PTX without its terminating NUL and bytes of unknown formats, which get one (copied), so
/// that no reader of the driver's can run past their end. All of the blob is checked except the
/// code of fatbin entries, which is checked for the device the blob is loaded on
/// ([`check_for_device`]). With `unknown_formats`, bytes of no format Atlas knows are taken as
/// they are, as [`BlobKind::Binary`] (the caller's promise, see
/// `AtlasRegistry::load_with_unknown_formats`).
pub(crate) fn prepare<'b>(
    module: &str,
    blob: &'b [u8],
    unknown_formats: bool,
) -> Result<(BlobKind, Cow<'b, [u8]>)> {
    let kind = match known(blob) {
        None if unknown_formats && !blob.is_empty() => BlobKind::Binary,
        kind => refused(module, check_known(blob, kind, None))?,
    };
    Ok((kind, image(kind, blob)))
}

/// The bytes to hand the driver of `blob`, of `kind`, as [`prepare`] makes them.
pub(crate) fn image(kind: BlobKind, blob: &[u8]) -> Cow<'_, [u8]> {
    let terminated = matches!(kind, BlobKind::Ptx | BlobKind::Binary) && !blob.ends_with(b"\0");
    if !terminated {
        return Cow::Borrowed(blob);
    }
    let mut owned = Vec::with_capacity(blob.len() + 1);
    owned.extend_from_slice(blob);
    owned.push(0);
    Cow::Owned(owned)
}

/// The rest of [`validate_blob_for_device`] after [`prepare`] made `image` of `kind`, for a device
/// of compute capability `compute_capability`: with `settle`, when what the driver loads of a
/// fatbin is settled, the cubin to hand it in place of the fatbin, its code checked
/// ([`fatbin::sole_sass`]); else (`None`) the code of the entries of a fatbin that such a device
/// may pick, each handed to `picked` once checked (what code it is, its bytes, whether they were
/// decompressed), so that what a load reads of it needs no second decompression.
pub(crate) fn check_for_device<'i>(
    module: &str,
    kind: BlobKind,
    image: &'i [u8],
    compute_capability: (u32, u32),
    settle: bool,
    picked: impl FnMut(Code, &[u8], bool),
) -> Result<Option<Cow<'i, [u8]>>> {
    if kind != BlobKind::Fatbin {
        return Ok(None);
    }
    let devices = Devices::of(compute_capability).unwrap_or(Devices::Every);
    if let Devices::Sm(sm) = devices
        && settle
        && !jit_forced()
        && let Some(sass) = refused(module, fatbin::sole_sass(image, sm))?
    {
        return Ok(Some(sass));
    }
    refused(module, fatbin::check_picked(image, Some(devices), picked)).map(|()| None)
}

/// What code `blob` holds, for messages: `sm_90 SASS` for a cubin, `sm_90 SASS, compute_90 PTX`
/// for a fatbin, `compute_75 PTX (ISA 8.0)` for PTX. Reads only what is there; never fails.
pub(crate) fn code_targets(blob: &[u8]) -> String {
    match sniff(blob) {
        BlobKind::Cubin => match cubin_arch(blob) {
            Some(arch) => format!("sm_{arch} SASS"),
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
                .map(|entry| match entry.code() {
                    Some(Code::Ptx(arch)) => format!("compute_{arch} PTX"),
                    Some(Code::Sass(arch)) => format!("sm_{arch} SASS"),
                    None => format!("an entry of kind {}", entry.kind),
                })
                .collect();
            if targets.is_empty() {
                "a fatbin without readable entries".into()
            } else {
                targets.join(", ")
            }
        }
        BlobKind::Ptx => {
            let header = ptx::header(blob);
            let isa = header
                .isa
                .map(|(major, minor)| format!(" (ISA {major}.{minor})"))
                .unwrap_or_default();
            match header.target {
                Some(arch) => format!("compute_{arch} PTX{isa}"),
                None => format!("PTX{isa} without a readable .target"),
            }
        }
        BlobKind::OffloadBundle => "a clang offload bundle".into(),
        BlobKind::Binary => "an unknown binary".into(),
    }
}
