//! Mutants of the committed blobs, for the blob fuzzer: a seed alone makes one mutant, and always
//! the same one for the same committed blobs.
//!
//! A mutant is a copy of one committed blob (a cubin, the fatbin, a PTX module, or a fatbin made
//! from the committed one's PTX entry) with one change,
//! or now and then two: random bytes changed, a truncation, a random tail, or a targeted change to
//! one field of the structures a loader follows (ELF header, section headers, symbols,
//! relocations, `.nv.info` records, fatbin headers) set to a value chosen to be interesting
//! (0, all ones, near the old value, near the blob's length or a table's count), or an edit of
//! PTX text. The structures are found by reading the unmutated blob; a mutation that finds none
//! falls back to changing random bytes.

use atlas_kernels::{CUBIN_ARCHS, ELEMENTWISE_FATBIN, MODELS, cubin_for_model, ptx_for_model};

use super::rng::Rng;

/// What a committed blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cubin,
    Fatbin,
    Ptx,
}

/// One committed blob to mutate.
pub struct Source {
    /// `model/module.cubin`, `elementwise.fatbin`, `model/module.ptx`.
    pub name: String,
    pub kind: Kind,
    pub blob: &'static [u8],
    /// Committed (rather than made by the fuzzer from a committed blob).
    pub committed: bool,
}

/// Every committed blob of `atlas_kernels`, in a fixed order: the cubins of every architecture
/// and the PTX of every model, the fatbin, and two fatbins made from the fatbin's PTX entry.
pub fn corpus() -> Vec<Source> {
    let mut corpus = Vec::new();
    for model in MODELS {
        let cubins = CUBIN_ARCHS.iter().map(|&sm| {
            (
                Kind::Cubin,
                cubin_for_model(model, sm),
                format!("sm_{sm}.cubin"),
            )
        });
        for (kind, blobs, ext) in cubins.chain([(Kind::Ptx, ptx_for_model(model), "ptx".into())]) {
            for (module, blob) in blobs.unwrap_or_default() {
                corpus.push(Source {
                    name: format!("{model}/{module}.{ext}"),
                    kind,
                    blob,
                    committed: true,
                });
            }
        }
    }
    corpus.push(Source {
        name: "elementwise.fatbin".into(),
        kind: Kind::Fatbin,
        blob: ELEMENTWISE_FATBIN,
        committed: true,
    });
    // The fatbin's PTX entry alone: a device the fatbin has SASS for takes the SASS, so its PTX
    // entry is read and compiled only where it is the fatbin's one entry. Plain, and compressed as
    // nvcc stores entries by default (no committed blob has a compressed entry, and what one
    // holds is the driver's to check, see `atlas-registry/src/blob/fatbin.rs`).
    for (compressed, name) in [(false, "plain"), (true, "zstd")] {
        corpus.push(Source {
            name: format!("elementwise.fatbin's PTX entry alone, {name}"),
            kind: Kind::Fatbin,
            blob: Vec::leak(ptx_entry_alone(ELEMENTWISE_FATBIN, compressed)),
            committed: false,
        });
    }
    corpus
}

/// A fatbin holding only the first PTX entry of `fatbin` (empty when it has none): as it is, or
/// zstd-compressed. The compressed payload is a zstd frame of one raw (stored) block, which is
/// what a zstd compressor writes for data it cannot shrink and every zstd decoder reads
/// (RFC 8878, 3.1.1): no compressor needed here.
pub fn ptx_entry_alone(fatbin: &[u8], compressed: bool) -> Vec<u8> {
    let Some(&(at, header, _)) = fatbin_entries(fatbin)
        .iter()
        .find(|&&(_, _, kind)| kind == 1)
    else {
        return Vec::new();
    };
    let payload_size = get(fatbin, at + 8, 8).unwrap_or(0) as usize;
    let (Some(header_bytes), Some(payload)) = (
        fatbin.get(at..at + header),
        fatbin.get(at + header..at + header + payload_size),
    ) else {
        return Vec::new();
    };
    let mut entry = header_bytes.to_vec();
    let payload = if compressed {
        // The text and its NUL, as nvcc compresses it.
        let text = payload
            .iter()
            .position(|&c| c == 0)
            .map_or(payload, |end| &payload[..=end]);
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd];
        // Single segment, an 8-byte content size, no checksum, no dictionary.
        frame.push(0xe0);
        frame.extend_from_slice(&(text.len() as u64).to_le_bytes());
        // The last block, raw, holding the text (at most 128 KiB: PTX entries are smaller).
        frame.extend_from_slice(&(1 | (text.len() as u32) << 3).to_le_bytes()[..3]);
        frame.extend_from_slice(text);
        put(&mut entry, 16, 4, frame.len() as u64);
        let flags = get(&entry, 40, 8).unwrap_or(0) | 0x8000;
        put(&mut entry, 40, 8, flags);
        put(&mut entry, 56, 8, text.len() as u64);
        frame.resize(frame.len().div_ceil(8) * 8, 0);
        frame
    } else {
        payload.to_vec()
    };
    put(&mut entry, 8, 8, payload.len() as u64);
    let mut b = fatbin.get(..16).unwrap_or_default().to_vec();
    put(&mut b, 8, 8, (entry.len() + payload.len()) as u64);
    b.extend_from_slice(&entry);
    b.extend_from_slice(&payload);
    b
}

/// A mutated blob and how it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutant {
    pub seed: u64,
    /// The index of its source in the corpus.
    pub source: usize,
    /// What was changed, for people.
    pub what: String,
    pub bytes: Vec<u8>,
}

/// The mutant of seed `seed`.
pub fn mutant(corpus: &[Source], seed: u64) -> Mutant {
    let mut rng = Rng::from_seed(seed);
    // Cubins most (the driver's ELF reader is what crashes), the fatbin often (one blob, two
    // layers), PTX least (text goes to a compiler, and every PTX load is a JIT compile).
    let kind = match rng.below(100) {
        0..55 => Kind::Cubin,
        55..85 => Kind::Fatbin,
        _ => Kind::Ptx,
    };
    let candidates: Vec<usize> = (0..corpus.len())
        .filter(|&i| corpus[i].kind == kind)
        .collect();
    let source = candidates[rng.index(candidates.len())];
    let mut bytes = corpus[source].blob.to_vec();
    let mut what = Vec::new();
    let rounds = if rng.chance(12) { 2 } else { 1 };
    for _ in 0..rounds {
        what.push(match kind {
            Kind::Cubin => mutate_elf_blob(&mut rng, &mut bytes, 0),
            Kind::Fatbin => mutate_fatbin(&mut rng, &mut bytes),
            Kind::Ptx => mutate_ptx(&mut rng, &mut bytes),
        });
    }
    Mutant {
        seed,
        source,
        what: format!("{}: {}", corpus[source].name, what.join("; then ")),
        bytes,
    }
}

// ---------------------------------------------------------------------------------------------
// Bytes
// ---------------------------------------------------------------------------------------------

fn get(b: &[u8], at: usize, width: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(width)?)?;
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |v, &byte| (v << 8) | u64::from(byte)),
    )
}

fn put(b: &mut [u8], at: usize, width: usize, value: u64) -> bool {
    let Some(bytes) = at.checked_add(width).and_then(|end| b.get_mut(at..end)) else {
        return false;
    };
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = (value >> (8 * i)) as u8;
    }
    true
}

/// A value for a `width`-byte field that held `old`: the edges, near the old value, near the
/// blob's length `len` or a count `count`, or anything.
fn interesting(rng: &mut Rng, old: u64, width: usize, len: u64, count: u64) -> u64 {
    let max = if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    let value = match rng.below(12) {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max >> 1,
        4 => (max >> 1) + 1,
        5 => old.wrapping_add(1 + rng.below(16)),
        6 => old.wrapping_sub(1 + rng.below(16)),
        7 => old ^ (1 << rng.below(8 * width as u64)),
        8 => len.wrapping_add(rng.below(64)).wrapping_sub(32),
        9 => count + rng.below(4),
        10 => rng.below(len.saturating_mul(2).saturating_add(1)),
        _ => rng.next_u64(),
    };
    value & max
}

/// Sets the `width`-byte field at `at` to an interesting value; says what it did.
fn set_field(
    rng: &mut Rng,
    b: &mut [u8],
    at: usize,
    width: usize,
    count: u64,
    name: &str,
) -> String {
    let Some(old) = get(b, at, width) else {
        return flip_bytes(rng, b);
    };
    let mut new = interesting(rng, old, width, b.len() as u64, count);
    if new == old {
        new = old ^ 1;
    }
    put(b, at, width, new);
    format!("{name} at {at}: {old:#x} -> {new:#x}")
}

fn flip_bytes(rng: &mut Rng, b: &mut [u8]) -> String {
    if b.is_empty() {
        return "nothing to flip in an empty blob".into();
    }
    let n = 1 + rng.index(8);
    let mut at = Vec::new();
    for _ in 0..n {
        let i = rng.index(b.len());
        b[i] ^= 1 + rng.below(255) as u8;
        at.push(i.to_string());
    }
    format!("{n} random byte(s) changed at {}", at.join(", "))
}

fn truncate(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    let len = rng.index(b.len());
    b.truncate(len);
    format!("truncated to {len} bytes")
}

fn garbage_tail(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    // Now and then the case measured to crash: a real ELF header, then garbage.
    let keep = if rng.chance(30) {
        b.len().min(64)
    } else {
        rng.index(b.len() + 1)
    };
    let tail = 1 + rng.index(4096);
    b.truncate(keep);
    b.extend(rng.bytes(tail));
    format!("first {keep} bytes, then {tail} random bytes")
}

fn generic(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    match rng.below(10) {
        0..6 => flip_bytes(rng, b),
        6..8 => truncate(rng, b),
        _ => garbage_tail(rng, b),
    }
}

// ---------------------------------------------------------------------------------------------
// ELF
// ---------------------------------------------------------------------------------------------

/// Where an ELF image's structures are (absolute offsets in the blob).
struct ElfMap {
    base: usize,
    shnum: u64,
    sections: Vec<Sec>,
    /// Offset and count of the first symbol table.
    symbols: Option<(usize, u64)>,
}

struct Sec {
    header: usize,
    kind: u32,
    offset: usize,
    size: usize,
    entsize: usize,
}

impl ElfMap {
    fn read(b: &[u8], base: usize) -> Option<Self> {
        let shoff = base.checked_add(usize::try_from(get(b, base + 40, 8)?).ok()?)?;
        let shnum = get(b, base + 60, 2)?;
        let mut sections = Vec::new();
        for i in 0..shnum as usize {
            let header = shoff.checked_add(i.checked_mul(64)?)?;
            sections.push(Sec {
                header,
                kind: get(b, header + 4, 4)? as u32,
                offset: base.checked_add(usize::try_from(get(b, header + 24, 8)?).ok()?)?,
                size: usize::try_from(get(b, header + 32, 8)?).ok()?,
                entsize: usize::try_from(get(b, header + 56, 8)?).ok()?,
            });
        }
        let symbols = sections
            .iter()
            .find(|s| s.kind == 2 && s.entsize == 24)
            .map(|s| (s.offset, (s.size / 24) as u64));
        Some(Self {
            base,
            shnum,
            sections,
            symbols,
        })
    }

    fn of_kind(&self, pick: impl Fn(&Sec) -> bool) -> Vec<&Sec> {
        self.sections.iter().filter(|s| pick(s)).collect()
    }
}

const ELF_HEADER_FIELDS: &[(usize, usize, &str)] = &[
    (4, 1, "EI_CLASS"),
    (5, 1, "EI_DATA"),
    (6, 1, "EI_VERSION"),
    (8, 1, "EI_ABIVERSION"),
    (16, 2, "e_type"),
    (18, 2, "e_machine"),
    (20, 4, "e_version"),
    (32, 8, "e_phoff"),
    (40, 8, "e_shoff"),
    (48, 4, "e_flags"),
    (52, 2, "e_ehsize"),
    (54, 2, "e_phentsize"),
    (56, 2, "e_phnum"),
    (58, 2, "e_shentsize"),
    (60, 2, "e_shnum"),
    (62, 2, "e_shstrndx"),
];

const SECTION_FIELDS: &[(usize, usize, &str)] = &[
    (0, 4, "sh_name"),
    (4, 4, "sh_type"),
    (8, 8, "sh_flags"),
    (24, 8, "sh_offset"),
    (32, 8, "sh_size"),
    (40, 4, "sh_link"),
    (44, 4, "sh_info"),
    (48, 8, "sh_addralign"),
    (56, 8, "sh_entsize"),
];

const SYMBOL_FIELDS: &[(usize, usize, &str)] = &[
    (0, 4, "st_name"),
    (4, 1, "st_info"),
    (5, 1, "st_other"),
    (6, 2, "st_shndx"),
    (8, 8, "st_value"),
    (16, 8, "st_size"),
];

/// A change to `cubin`, an ELF image alone (what a compressed fatbin entry holds): as the
/// mutants of committed cubins are changed. Says what it did.
pub fn mutate_cubin(rng: &mut Rng, cubin: &mut Vec<u8>) -> String {
    mutate_elf_blob(rng, cubin, 0)
}

/// A change to the ELF image at `base` of `b`, or to `b` as a whole.
fn mutate_elf_blob(rng: &mut Rng, b: &mut Vec<u8>, base: usize) -> String {
    let Some(map) = ElfMap::read(b, base) else {
        return generic(rng, b);
    };
    let elf = |what: String| {
        if base == 0 {
            what
        } else {
            format!("ELF at {base}: {what}")
        }
    };
    match rng.below(100) {
        0..20 => generic(rng, b),
        20..30 => {
            let (at, width, name) = ELF_HEADER_FIELDS[rng.index(ELF_HEADER_FIELDS.len())];
            elf(set_field(rng, b, base + at, width, map.shnum, name))
        }
        30..58 if !map.sections.is_empty() => {
            let i = rng.index(map.sections.len());
            let (at, width, name) = SECTION_FIELDS[rng.index(SECTION_FIELDS.len())];
            let name = format!("section {i} {name}");
            let header = map.sections[i].header;
            elf(set_field(rng, b, header + at, width, map.shnum, &name))
        }
        58..70 => match map.symbols {
            Some((table, count)) if count > 0 => {
                let n = rng.below(count);
                let (at, width, name) = SYMBOL_FIELDS[rng.index(SYMBOL_FIELDS.len())];
                let name = format!("symbol {n} {name}");
                elf(set_field(
                    rng,
                    b,
                    table + 24 * n as usize + at,
                    width,
                    map.shnum,
                    &name,
                ))
            }
            _ => generic(rng, b),
        },
        70..80 => {
            let tables = map.of_kind(|s| matches!(s.kind, 4 | 9) && s.entsize > 0);
            let Some(table) = tables.get(rng.index(tables.len())) else {
                return generic(rng, b);
            };
            let count = (table.size / table.entsize).max(1);
            let n = rng.index(count);
            let fields: &[(usize, usize, &str)] = &[
                (0, 8, "r_offset"),
                (8, 4, "r_type"),
                (12, 4, "r_sym"),
                (16, 8, "r_addend"),
            ];
            let fields = if table.entsize == 16 {
                &fields[..3]
            } else {
                fields
            };
            let (at, width, name) = fields[rng.index(fields.len())];
            let name = format!("relocation {n} {name}");
            let symbols = map.symbols.map_or(0, |(_, count)| count);
            let at = table.offset + table.entsize * n + at;
            elf(set_field(rng, b, at, width, symbols, &name))
        }
        _ => {
            let infos = map.of_kind(|s| s.kind == 0x7000_0000 || s.kind == 0x7000_0086);
            let Some(info) = infos.get(rng.index(infos.len())) else {
                return generic(rng, b);
            };
            let (start, size) = (info.offset, info.size);
            elf(mutate_record(
                rng,
                b,
                start,
                size,
                map.symbols.map_or(0, |s| s.1),
            ))
        }
    }
}

/// Every attribute record of the `.nv.info` sections of cubin `b` (`SHT_CUDA_INFO`), as far as
/// they can be read: `(offset of the record in b, format, attribute, sh_info of its section)`.
pub fn info_records(b: &[u8]) -> Vec<(usize, u8, u8, u32)> {
    let Some(map) = ElfMap::read(b, 0) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for info in map.of_kind(|s| s.kind == 0x7000_0000) {
        let owner = get(b, info.header + 44, 4).unwrap_or(0) as u32;
        let mut at = info.offset;
        while at + 4 <= info.offset + info.size {
            let (Some(format), Some(attribute), Some(half)) =
                (get(b, at, 1), get(b, at + 1, 1), get(b, at + 2, 2))
            else {
                break;
            };
            records.push((at, format as u8, attribute as u8, owner));
            let value = if format == 4 { half as usize } else { 0 };
            at = (at + 4 + value + 3) & !3;
        }
    }
    records
}

/// A change to one `.nv.info` attribute record of the section at `start`.
fn mutate_record(rng: &mut Rng, b: &mut [u8], start: usize, size: usize, symbols: u64) -> String {
    let mut records = Vec::new();
    let mut at = start;
    while at < start + size && records.len() < 256 {
        let (Some(format), Some(half)) = (get(b, at, 1), get(b, at + 2, 2)) else {
            break;
        };
        let value = if format == 4 { half as usize } else { 0 };
        records.push((at, value));
        at = (at + 4 + value + 3) & !3;
    }
    let Some(&(at, value)) = records.get(rng.index(records.len())) else {
        return flip_bytes(rng, b);
    };
    match rng.below(4) {
        0 => {
            let old = b.get(at).copied().unwrap_or(0);
            let format = (old + 1 + rng.below(7) as u8) % 8;
            put(b, at, 1, u64::from(format));
            format!(".nv.info record at {at}: format {old} -> {format}")
        }
        1 => set_field(rng, b, at + 1, 1, 0, ".nv.info record attribute"),
        2 => set_field(
            rng,
            b,
            at + 2,
            2,
            value as u64,
            ".nv.info record value/size",
        ),
        _ if value >= 4 => {
            let word = rng.index(value / 4);
            let name = format!(".nv.info record word {word}");
            set_field(rng, b, at + 4 + 4 * word, 4, symbols, &name)
        }
        _ => set_field(rng, b, at + 2, 2, 0, ".nv.info record value/size"),
    }
}

// ---------------------------------------------------------------------------------------------
// Fatbin
// ---------------------------------------------------------------------------------------------

const FATBIN_ENTRY_FIELDS: &[(usize, usize, &str)] = &[
    (0, 2, "kind"),
    (2, 2, "version"),
    (4, 4, "header size"),
    (8, 8, "payload size"),
    (16, 4, "compressed size"),
    (24, 2, "minor version"),
    (26, 2, "major version"),
    (28, 4, "arch"),
    (32, 4, "name offset"),
    (36, 4, "name size"),
    (40, 8, "flags"),
    (48, 8, "reserved"),
    (56, 8, "uncompressed size"),
    (64, 4, "extension word 0"),
    (68, 4, "extension word 1"),
    (72, 8, "extension word 2"),
];

/// Entry offsets, header sizes and kinds of a fatbin.
fn fatbin_entries(b: &[u8]) -> Vec<(usize, usize, u64)> {
    let mut entries = Vec::new();
    let (Some(header), Some(body)) = (get(b, 6, 2), get(b, 8, 8)) else {
        return entries;
    };
    let end = (header as usize).saturating_add(body as usize).min(b.len());
    let mut at = header as usize;
    while at < end && entries.len() < 64 {
        let (Some(kind), Some(size), Some(payload)) =
            (get(b, at, 2), get(b, at + 4, 4), get(b, at + 8, 8))
        else {
            break;
        };
        if size < 64 {
            break;
        }
        entries.push((at, size as usize, kind));
        let Some(next) = at
            .checked_add(size as usize)
            .and_then(|n| n.checked_add(usize::try_from(payload).ok()?))
        else {
            break;
        };
        at = next;
    }
    entries
}

fn mutate_fatbin(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    let entries = fatbin_entries(b);
    // A plain PTX entry: its text is edited as PTX is.
    let plain_ptx = entries.iter().copied().find(|&(at, _, kind)| {
        kind == 1 && get(b, at + 40, 8).is_some_and(|flags| flags & 0xb000 == 0)
    });
    if let Some((at, size, _)) = plain_ptx
        && rng.chance(40)
    {
        return edit_fatbin_ptx(rng, b, at, size);
    }
    match rng.below(100) {
        0..15 => generic(rng, b),
        15..25 => {
            let fields: &[(usize, usize, &str)] = &[
                (4, 2, "version"),
                (6, 2, "header size"),
                (8, 8, "body size"),
            ];
            let (at, width, name) = fields[rng.index(fields.len())];
            set_field(rng, b, at, width, 0, &format!("fatbin header {name}"))
        }
        25..55 => {
            let Some(&(at, size, _)) = entries.get(rng.index(entries.len())) else {
                return generic(rng, b);
            };
            let fields: Vec<_> = FATBIN_ENTRY_FIELDS
                .iter()
                .filter(|(offset, width, _)| offset + width <= size)
                .collect();
            let &(offset, width, name) = fields[rng.index(fields.len())];
            let count = entries.len() as u64;
            set_field(
                rng,
                b,
                at + offset,
                width,
                count,
                &format!("fatbin entry at {at}: {name}"),
            )
        }
        _ => {
            // The ELF inside: one uncompressed ELF entry's payload.
            let elves: Vec<usize> = entries
                .iter()
                .filter(|&&(at, size, kind)| {
                    kind == 2
                        && get(b, at + 40, 8).is_some_and(|flags| flags & 0xb000 == 0)
                        && b.get(at + size..at + size + 4) == Some(b"\x7fELF")
                })
                .map(|&(at, size, _)| at + size)
                .collect();
            match elves.get(rng.index(elves.len())) {
                Some(&base) => mutate_elf_blob(rng, b, base),
                None => generic(rng, b),
            }
        }
    }
}

/// Edits the text of the plain PTX entry at `at` (header `size` bytes) and lays the fatbin out
/// again around it: the entry's payload size and the fatbin's body size follow the new text,
/// which ends in a NUL unless the edit is to drop it.
fn edit_fatbin_ptx(rng: &mut Rng, b: &mut Vec<u8>, at: usize, size: usize) -> String {
    let (Some(payload), Some(body)) = (get(b, at + 8, 8), get(b, 8, 8)) else {
        return flip_bytes(rng, b);
    };
    let start = at + size;
    let Some(end) = usize::try_from(payload)
        .ok()
        .and_then(|p| start.checked_add(p))
    else {
        return flip_bytes(rng, b);
    };
    let Some(old) = b.get(start..end) else {
        return flip_bytes(rng, b);
    };
    let mut text = old.to_vec();
    while text.last() == Some(&0) {
        text.pop();
    }
    let mut what = edit_ptx(rng, &mut text);
    if rng.chance(10) {
        what.push_str(", without its NUL");
    } else {
        text.push(0);
    }
    text.resize(text.len().div_ceil(8) * 8, 0);
    let new = text.len() as u64;
    b.splice(start..end, text);
    put(b, at + 8, 8, new);
    put(b, 8, 8, body.wrapping_add(new).wrapping_sub(payload));
    format!("PTX entry at {at}: {what}")
}

// ---------------------------------------------------------------------------------------------
// PTX
// ---------------------------------------------------------------------------------------------

fn mutate_ptx(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    // Edit the text; a terminating NUL stays where it is.
    let terminated = b.last() == Some(&0);
    if terminated {
        b.pop();
    }
    let what = edit_ptx(rng, b);
    if terminated {
        b.push(0);
    }
    what
}

fn edit_ptx(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    let len = b.len();
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(
            b.iter()
                .enumerate()
                .filter(|(_, c)| **c == b'\n')
                .map(|(i, _)| i + 1),
        )
        .filter(|&i| i < len)
        .collect();
    let line = |rng: &mut Rng| -> (usize, usize) {
        let n = rng.index(line_starts.len());
        let start = line_starts.get(n).copied().unwrap_or(0);
        let end = line_starts.get(n + 1).copied().unwrap_or(len);
        (start, end)
    };
    match rng.below(10) {
        0 => {
            let at = rng.index(b.len() + 1);
            b.insert(at, 0);
            format!("NUL inserted at {at}")
        }
        1 => {
            let (start, end) = line(rng);
            b.drain(start..end);
            format!("line at {start} deleted")
        }
        2 => {
            let (start, end) = line(rng);
            let copy = b[start..end].to_vec();
            b.splice(start..start, copy);
            format!("line at {start} repeated")
        }
        3 => {
            // A number replaced by another (register counts, sizes, offsets, versions).
            let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
            let Some(&at) = digits.get(rng.index(digits.len())) else {
                return flip_bytes(rng, b);
            };
            let end = (at..b.len())
                .find(|&i| !b[i].is_ascii_digit())
                .unwrap_or(b.len());
            let number = interesting(rng, 0, 8, 1 << 20, 0).to_string();
            b.splice(at..end, number.bytes());
            format!("number at {at} replaced by {number}")
        }
        4 => {
            let directive = if rng.chance(50) {
                ".version"
            } else {
                ".target"
            };
            let replacement = match rng.below(4) {
                0 => "99.9",
                1 => "sm_1234",
                2 => "compute_20",
                _ => "\u{1}\u{2}",
            };
            let Some(at) = b
                .windows(directive.len())
                .position(|w| w == directive.as_bytes())
            else {
                return flip_bytes(rng, b);
            };
            let start = at + directive.len() + 1;
            let end = (start..b.len()).find(|&i| b[i] == b'\n').unwrap_or(b.len());
            if start <= end {
                b.splice(start..end, replacement.bytes());
            }
            format!("{directive} set to {replacement:?}")
        }
        5 => truncate(rng, b),
        6 => {
            let at = rng.index(b.len() + 1);
            let n = 1 + rng.index(64);
            let junk = rng.bytes(n);
            b.splice(at..at, junk);
            format!("{n} random bytes inserted at {at}")
        }
        7 => {
            let Some(at) = (!b.is_empty()).then(|| rng.index(b.len())) else {
                return "empty text".into();
            };
            let c = b"{}();,.%[]<>:"[rng.index(13)];
            b[at] = c;
            format!("byte at {at} set to {:?}", c as char)
        }
        8 => {
            let (a, _) = line(rng);
            let (c, _) = line(rng);
            let (first, second) = (a.min(c), a.max(c));
            let first_end = (first..b.len())
                .find(|&i| b[i] == b'\n')
                .map_or(b.len(), |i| i + 1);
            if first_end <= second {
                let moved: Vec<u8> = b.drain(first..first_end).collect();
                let at = second - moved.len();
                b.splice(at..at, moved);
            }
            format!("line at {first} moved before the line at {second}")
        }
        _ => flip_bytes(rng, b),
    }
}
