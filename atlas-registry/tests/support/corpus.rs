//! Blobs on disk, as real code ships them: the fatbins in the `.nv_fatbin` and `__nv_relfatbin`
//! sections of ELF shared libraries and objects, and blob files (`.fatbin`, `.cubin`, `.ptx`,
//! and any ELF for `EM_CUDA`), found under the paths a test is given; when asked, also the
//! fatbins a library keeps in its data sections and loads itself (cuFFT 12 keeps about 24,000 in
//! `.ldata`).
//!
//! A fatbin section holds fatbins one after another, each starting 8-byte aligned (zero padding
//! between them): a fatbin's 16-byte header says how long it is. Only headers are read while
//! finding blobs there; a data section is read whole and searched, at 8-byte aligned offsets, for
//! a fatbin header (magic, version 1, header size 16, a body of at least one entry header inside
//! the section). [`Blob::read`] reads one blob's bytes.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use atlas_registry::{AtlasError, BlobKind, validate_blob, validate_blob_for_device};

use super::fatbin::MAGIC;

/// The sections whose contents are fatbins.
pub const FATBIN_SECTIONS: &[&str] = &[".nv_fatbin", "__nv_relfatbin"];
/// The data sections searched for fatbins when asked.
pub const DATA_SECTIONS: &[&str] = &[".rodata", ".lrodata", ".data", ".ldata", ".data.rel.ro"];
/// `e_machine` of an NVIDIA GPU ELF (a cubin).
const EM_CUDA: u16 = 190;

/// One blob: a byte range of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The file (its canonical path).
    pub file: PathBuf,
    /// The index of the path the file was found under.
    pub root: usize,
    pub offset: u64,
    pub len: u64,
    /// Where in the file: `.nv_fatbin fatbin 3`, or `file`.
    pub place: String,
}

impl Blob {
    /// `libcublas.so.13: .nv_fatbin fatbin 3 at 0x1a2b00 (5120 bytes)`.
    pub fn name(&self) -> String {
        let file = self.file.file_name().map_or_else(
            || self.file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        format!(
            "{file}: {} at {:#x} ({} bytes)",
            self.place, self.offset, self.len
        )
    }

    /// The blob's bytes.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        read_range(&self.file, self.offset, self.len)
    }

    /// The blob as one line (`offset len path`), for a child process; [`read_line`] reads it.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.offset, self.len, self.file.display())
    }
}

/// The bytes of the blob a [`Blob::line`] names.
pub fn read_line(line: &str) -> std::io::Result<Vec<u8>> {
    let mut parts = line.splitn(3, ' ');
    let (Some(offset), Some(len), Some(path)) = (
        parts.next().and_then(|o| o.parse().ok()),
        parts.next().and_then(|l| l.parse().ok()),
        parts.next(),
    ) else {
        return Err(std::io::Error::other(format!("not a blob line: {line:?}")));
    };
    read_range(Path::new(path), offset, len)
}

fn read_range(file: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; len as usize];
    File::open(file)?.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

/// What [`find`] found.
#[derive(Debug, Default)]
pub struct Found {
    pub blobs: Vec<Blob>,
    /// ELF files with at least one fatbin in their sections.
    pub elf_files: usize,
    /// Files that are one blob each.
    pub blob_files: usize,
    /// Files looked at that hold no blob.
    pub skipped: usize,
    /// Bytes in fatbin sections that start no fatbin and are not padding: where, and how many
    /// 8-byte words.
    pub stray: Vec<(String, u64)>,
}

/// The paths of a `:`-separated list, empty parts left out.
pub fn paths(list: &str) -> Vec<PathBuf> {
    list.split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Every blob under `roots` (files, or directories walked in name order), each file once
/// (symbolic links to a file already seen are skipped); with `data_sections`, also the fatbins
/// in ELF files' [`DATA_SECTIONS`].
pub fn find(roots: &[PathBuf], data_sections: bool) -> std::io::Result<Found> {
    let mut found = Found::default();
    let mut seen = BTreeSet::new();
    for (root, path) in roots.iter().enumerate() {
        let mut files = Vec::new();
        walk(&std::fs::canonicalize(path)?, &mut files)?;
        for file in files {
            if seen.insert(file.clone()) {
                look_at(&file, root, data_sections, &mut found)?;
            }
        }
    }
    Ok(found)
}

/// The regular files under `path`, in name order (symbolic links followed to files, not into
/// directories).
fn walk(path: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for entry in entries {
            walk(&entry, files)?;
        }
    } else if let Ok(target) = std::fs::canonicalize(path)
        && target.is_file()
    {
        files.push(target);
    }
    Ok(())
}

fn look_at(file: &Path, root: usize, data: bool, found: &mut Found) -> std::io::Result<()> {
    let handle = File::open(file)?;
    let len = handle.metadata()?.len();
    let mut head = [0u8; 64];
    let elf = len >= 64 && handle.read_exact_at(&mut head, 0).is_ok() && head[..4] == *b"\x7fELF";
    let whole = |found: &mut Found| {
        found.blob_files += 1;
        found.blobs.push(Blob {
            file: file.to_path_buf(),
            root,
            offset: 0,
            len,
            place: "file".into(),
        });
    };
    if elf && u16::from_le_bytes([head[18], head[19]]) == EM_CUDA {
        whole(found);
        return Ok(());
    }
    if elf && head[4] == 2 && head[5] == 1 {
        let before = found.blobs.len();
        let sections = fatbin_sections(&handle, &head, data)?;
        for (name, offset, size) in sections {
            if FATBIN_SECTIONS.contains(&name.as_str()) {
                split(&handle, file, root, &name, offset, size, found)?;
            } else {
                search(&handle, file, root, &name, offset, size, found)?;
            }
        }
        if found.blobs.len() > before {
            found.elf_files += 1;
            return Ok(());
        }
    }
    let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
    if matches!(ext, "fatbin" | "cubin" | "ptx") && !elf {
        whole(found);
    } else {
        found.skipped += 1;
    }
    Ok(())
}

/// The fatbin sections of a 64-bit little-endian ELF file (and with `data`, its data sections):
/// name, file offset, size.
fn fatbin_sections(
    file: &File,
    head: &[u8; 64],
    data: bool,
) -> std::io::Result<Vec<(String, u64, u64)>> {
    let u16_ = |b: &[u8], at: usize| u64::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let u32_ = |b: &[u8], at: usize| {
        u64::from(u32::from_le_bytes(
            b[at..at + 4].try_into().expect("4 bytes"),
        ))
    };
    let u64_ = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let len = file.metadata()?.len();
    let (shoff, shentsize, mut shnum, mut shstrndx) = (
        u64_(head, 40),
        u16_(head, 58),
        u16_(head, 60),
        u16_(head, 62),
    );
    if shoff == 0 || shentsize != 64 || shoff >= len {
        return Ok(Vec::new());
    }
    let mut first = [0u8; 64];
    file.read_exact_at(&mut first, shoff)?;
    // Past 0xff00 sections, the counts live in section 0.
    if shnum == 0 {
        shnum = u64_(&first, 32);
    }
    if shstrndx == 0xffff {
        shstrndx = u32_(&first, 44);
    }
    if shnum == 0 || shoff + shnum * 64 > len || shstrndx >= shnum {
        return Ok(Vec::new());
    }
    let mut table = vec![0u8; (shnum * 64) as usize];
    file.read_exact_at(&mut table, shoff)?;
    let section = |i: u64| &table[(i * 64) as usize..(i * 64 + 64) as usize];
    let strings = section(shstrndx);
    let (str_offset, str_size) = (u64_(strings, 24), u64_(strings, 32));
    if str_offset + str_size > len {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; str_size as usize];
    file.read_exact_at(&mut names, str_offset)?;
    let mut out = Vec::new();
    for i in 0..shnum {
        let s = section(i);
        let name_at = u32_(s, 0) as usize;
        let name = names
            .get(name_at..)
            .and_then(|n| n.split(|&b| b == 0).next())
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        // SHT_NOBITS has no bytes in the file.
        let wanted = FATBIN_SECTIONS.contains(&name.as_ref())
            || (data && DATA_SECTIONS.contains(&name.as_ref()));
        if wanted && u32_(s, 4) != 8 {
            let (offset, size) = (u64_(s, 24), u64_(s, 32));
            if offset + size <= len {
                out.push((name.into_owned(), offset, size));
            }
        }
    }
    Ok(out)
}

/// The fatbins of the section `name` at `offset` (`size` bytes) of `file`.
fn split(
    handle: &File,
    file: &Path,
    root: usize,
    name: &str,
    offset: u64,
    size: u64,
    found: &mut Found,
) -> std::io::Result<()> {
    let end = offset + size;
    let (mut at, mut count, mut stray, mut first_stray) = (offset, 0, 0, None);
    while at + 16 <= end {
        let mut header = [0u8; 16];
        handle.read_exact_at(&mut header, at)?;
        let word = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        if u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) == MAGIC {
            let header_size = u64::from(u16::from_le_bytes([header[6], header[7]]));
            // A fatbin that claims to run past its section is cut at the section's end: its
            // header is then for Atlas and the driver to refuse.
            let len = header_size.saturating_add(word(8)).clamp(16, end - at);
            found.blobs.push(Blob {
                file: file.to_path_buf(),
                root,
                offset: at,
                len,
                place: format!("{name} fatbin {count}"),
            });
            count += 1;
            at = offset + (at - offset + len).div_ceil(8) * 8;
        } else {
            if word(0) != 0 {
                stray += 1;
                first_stray.get_or_insert(at);
            }
            at += 8;
        }
    }
    if let Some(first) = first_stray {
        found
            .stray
            .push((format!("{}: {name} from {first:#x}", file.display()), stray));
    }
    Ok(())
}

/// The fatbins in the data section `name` at `offset` (`size` bytes) of `file`, wherever a
/// fatbin header starts at an 8-byte aligned offset of the file.
fn search(
    handle: &File,
    file: &Path,
    root: usize,
    name: &str,
    offset: u64,
    size: u64,
    found: &mut Found,
) -> std::io::Result<()> {
    let mut bytes = vec![0u8; size as usize];
    handle.read_exact_at(&mut bytes, offset)?;
    let word = |at: usize, width: usize| {
        bytes[at..at + width]
            .iter()
            .rev()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b))
    };
    let mut at = (offset.div_ceil(8) * 8 - offset) as usize;
    let mut count = 0;
    while at + 16 <= bytes.len() {
        let body = word(at + 8, 8);
        let fits = body >= 64 && body <= (bytes.len() - at - 16) as u64;
        if word(at, 4) as u32 == MAGIC && word(at + 4, 2) == 1 && word(at + 6, 2) == 16 && fits {
            found.blobs.push(Blob {
                file: file.to_path_buf(),
                root,
                offset: offset + at as u64,
                len: 16 + body,
                place: format!("{name} fatbin {count}"),
            });
            count += 1;
            at += (16 + body as usize).div_ceil(8) * 8;
        } else {
            at += 8;
        }
    }
    Ok(())
}

/// Atlas's verdict on `blob` for a device of compute capability `sm` (90 for 9.0): its kind, or
/// the reason it is refused.
///
/// This is the one place the corpus tests ask Atlas: [`validate_blob`] for the blob as a whole
/// (every entry any device may pick), and [`validate_blob_for_device`], the check
/// `AtlasRegistry::load` makes on that device.
pub fn atlas_verdict(module: &str, blob: &[u8], sm: u32) -> Result<BlobKind, String> {
    let reason = |e: AtlasError| match e {
        AtlasError::InvalidModule { reason, .. } => reason,
        other => other.to_string(),
    };
    let kind = validate_blob(module, blob).map_err(reason)?;
    validate_blob_for_device(module, blob, (sm / 10, sm % 10)).map_err(reason)?;
    Ok(kind)
}

/// A refusal reason with its particulars taken out, so that the same refusal of many blobs
/// reads the same: decimal numbers (offsets, sizes, entry indices) become `#`; hexadecimal ones
/// (flags, the bits at fault) and architectures (`sm_120`) are kept.
pub fn reason_group(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let bytes = reason.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts_number = c.is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric());
        let kept = reason[..i].ends_with("sm_") || reason[..i].ends_with("compute_");
        if starts_number && c == b'0' && bytes.get(i + 1) == Some(&b'x') {
            let end = (i + 2..bytes.len())
                .find(|&j| !bytes[j].is_ascii_hexdigit())
                .unwrap_or(bytes.len());
            out.push_str(&reason[i..end]);
            i = end;
        } else if starts_number && !kept {
            // A thousands separator is part of the number; a comma after it is not.
            let digit = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_digit);
            let end = (i..bytes.len())
                .find(|&j| !(digit(j) || (bytes[j] == b',' && digit(j + 1))))
                .unwrap_or(bytes.len());
            out.push('#');
            i = end;
        } else {
            let len = reason[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&reason[i..i + len]);
            i += len;
        }
    }
    out
}
