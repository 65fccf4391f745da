//! Fatbins as the corpus and fuzz tests take them apart and put them together again: the header,
//! the entries with their headers as stored, and the contents of compressed entries.
//!
//! The layout is the one `atlas-registry/src/code/blob/fatbin.rs` describes: a 16-byte header
//! (`u32 magic, u16 version, u16 header size, u64 body size`), then entries that fill the body,
//! each a header (`u16 kind` at 0, `u32 header size` at 4, `u64 payload size` at 8, `u32
//! compressed size` at 16, `u32 arch` at 28, `u64 flags` at 40, `u64 uncompressed size` at 56)
//! and its payload. nvcc 13 compresses a payload with NVIDIA's LZ4 block format (flag `0x2000`,
//! `-compress-mode=speed`) or zstd (flag `0x8000`, every other mode but `none`); the payload is
//! the compressed bytes, zero-padded to 8, and the compressed size counts them without padding.
//! This reader is the tests' own, written apart from Atlas's: it is what the mutants are made
//! with, not what they test.

/// The fatbin magic.
pub const MAGIC: u32 = 0xBA55_ED50;
/// An entry of PTX text.
pub const KIND_PTX: u16 = 1;
/// An entry holding an ELF image (a cubin).
pub const KIND_ELF: u16 = 2;
/// NVIDIA's LZ4 block compression.
pub const FLAG_LZ4: u64 = 0x2000;
/// zstd compression.
pub const FLAG_ZSTD: u64 = 0x8000;
/// Every compression flag a toolchain writes (`0x1000` is an older NVIDIA scheme).
pub const FLAGS_COMPRESSED: u64 = 0x1000 | FLAG_LZ4 | FLAG_ZSTD;
/// The header of a fatbin.
pub const HEADER_SIZE: usize = 16;

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    Plain,
    Lz4,
    Zstd,
}

impl Scheme {
    /// The scheme of `flags`; `None` for a compression these tests do not read (`0x1000`, or
    /// more than one flag).
    pub fn of(flags: u64) -> Option<Self> {
        match flags & FLAGS_COMPRESSED {
            0 => Some(Self::Plain),
            FLAG_LZ4 => Some(Self::Lz4),
            FLAG_ZSTD => Some(Self::Zstd),
            _ => None,
        }
    }

    /// The entry flag that names this scheme.
    pub fn flag(self) -> u64 {
        match self {
            Self::Plain => 0,
            Self::Lz4 => FLAG_LZ4,
            Self::Zstd => FLAG_ZSTD,
        }
    }

    /// `contents` stored with this scheme: the payload (padded to 8) and the compressed size.
    pub fn store(self, contents: &[u8]) -> (Vec<u8>, usize) {
        let mut payload = match self {
            Self::Plain => contents.to_vec(),
            Self::Lz4 => lz4_flex::block::compress(contents),
            // The library's default level; the frame declares its content size, as nvcc's do.
            Self::Zstd => zstd::bulk::compress(contents, 0).expect("zstd compresses in memory"),
        };
        let compressed = if self == Self::Plain {
            0
        } else {
            payload.len()
        };
        payload.resize(payload.len().div_ceil(8) * 8, 0);
        (payload, compressed)
    }
}

/// One entry of a fatbin, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its header, extension included (`header size` bytes).
    pub header: Vec<u8>,
    /// Its payload (`payload size` bytes, compressed or not).
    pub payload: Vec<u8>,
}

impl Entry {
    pub fn kind(&self) -> u16 {
        get(&self.header, 0, 2) as u16
    }

    /// The SM number (90 for sm_90 and compute_90).
    pub fn arch(&self) -> u32 {
        get(&self.header, 28, 4) as u32
    }

    pub fn flags(&self) -> u64 {
        get(&self.header, 40, 8)
    }

    pub fn scheme(&self) -> Option<Scheme> {
        Scheme::of(self.flags())
    }

    pub fn compressed_size(&self) -> usize {
        get(&self.header, 16, 4) as usize
    }

    pub fn uncompressed_size(&self) -> usize {
        get(&self.header, 56, 8) as usize
    }

    /// `ELF sm_90 zstd`, `PTX compute_120 plain`.
    pub fn describe(&self) -> String {
        let (kind, arch) = match self.kind() {
            KIND_PTX => ("PTX", "compute"),
            KIND_ELF => ("ELF", "sm"),
            _ => ("kind?", "arch"),
        };
        let scheme = self.scheme().map_or_else(
            || format!("flags {:#x}", self.flags()),
            |s| format!("{s:?}"),
        );
        format!("{kind} {arch}_{} {}", self.arch(), scheme.to_lowercase())
    }

    /// What the payload holds: decompressed (to exactly the declared uncompressed size), or as
    /// stored for a plain entry. PTX keeps its terminating NUL and padding as stored.
    pub fn contents(&self) -> Result<Vec<u8>, String> {
        let size = self.uncompressed_size();
        let compressed = self.payload.get(..self.compressed_size());
        let out = match (self.scheme(), compressed) {
            (Some(Scheme::Plain), _) => return Ok(self.payload.clone()),
            (None, _) => return Err(format!("flags {:#x}: not a known scheme", self.flags())),
            (Some(_), None) => return Err("the compressed size is past the payload".into()),
            (Some(Scheme::Lz4), Some(data)) => {
                lz4_flex::block::decompress(data, size).map_err(|e| format!("LZ4: {e}"))?
            }
            (Some(Scheme::Zstd), Some(data)) => {
                zstd::bulk::decompress(data, size).map_err(|e| format!("zstd: {e}"))?
            }
        };
        if out.len() != size {
            return Err(format!(
                "decompresses to {} bytes, not the declared {size}",
                out.len()
            ));
        }
        Ok(out)
    }

    /// This entry with `contents` stored by `scheme`: the header's flags, payload size,
    /// compressed size and uncompressed size follow (the last two 0 for a plain entry, as
    /// toolchains write them); everything else in the header is kept.
    pub fn restored(&self, contents: &[u8], scheme: Scheme) -> Entry {
        let (payload, compressed) = scheme.store(contents);
        let mut header = self.header.clone();
        let flags = (self.flags() & !FLAGS_COMPRESSED) | scheme.flag();
        put(&mut header, 40, 8, flags);
        put(&mut header, 8, 8, payload.len() as u64);
        put(&mut header, 16, 4, compressed as u64);
        let uncompressed = if scheme == Scheme::Plain {
            0
        } else {
            contents.len()
        };
        put(&mut header, 56, 8, uncompressed as u64);
        Entry { header, payload }
    }
}

/// A fatbin taken apart: its 16-byte header and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatbin {
    pub header: Vec<u8>,
    pub entries: Vec<Entry>,
}

impl Fatbin {
    /// Reads `blob` as a fatbin whose entries fill its body exactly.
    pub fn parse(blob: &[u8]) -> Result<Self, String> {
        if blob.len() < HEADER_SIZE || get(blob, 0, 4) as u32 != MAGIC {
            return Err("not a fatbin".into());
        }
        let header_size = get(blob, 6, 2) as usize;
        let end = header_size
            .checked_add(get(blob, 8, 8) as usize)
            .filter(|&end| end <= blob.len() && header_size >= HEADER_SIZE)
            .ok_or("the body is past the end of the blob")?;
        let mut entries = Vec::new();
        let mut at = header_size;
        while at < end {
            let size = get(blob, at + 4, 4) as usize;
            let payload = get(blob, at + 8, 8) as usize;
            let start = at.checked_add(size).filter(|_| size >= 64);
            let stop = start
                .and_then(|s| s.checked_add(payload))
                .filter(|&s| s <= end);
            let (Some(start), Some(stop)) = (start, stop) else {
                return Err(format!("entry at {at} runs past the body"));
            };
            entries.push(Entry {
                header: blob[at..start].to_vec(),
                payload: blob[start..stop].to_vec(),
            });
            at = stop;
        }
        Ok(Self {
            header: blob[..header_size].to_vec(),
            entries,
        })
    }

    /// Lays the fatbin out again, the body size following its entries.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.header.clone();
        for entry in &self.entries {
            out.extend_from_slice(&entry.header);
            out.extend_from_slice(&entry.payload);
        }
        let body = out.len() - self.header.len();
        put(&mut out, 8, 8, body as u64);
        out
    }

    /// A fatbin of this one's header and `entries` alone.
    pub fn with_entries(&self, entries: Vec<Entry>) -> Self {
        Self {
            header: self.header.clone(),
            entries,
        }
    }
}

fn get(b: &[u8], at: usize, width: usize) -> u64 {
    b.get(at..at + width).map_or(0, |bytes| {
        bytes
            .iter()
            .rev()
            .fold(0u64, |v, &byte| (v << 8) | u64::from(byte))
    })
}

fn put(b: &mut [u8], at: usize, width: usize, value: u64) {
    for (i, byte) in b[at..at + width].iter_mut().enumerate() {
        *byte = (value >> (8 * i)) as u8;
    }
}
