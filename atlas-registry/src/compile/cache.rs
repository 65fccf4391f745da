//! [`CompileCache`]: the persistent, content-addressed cache of what NVRTC made.
//!
//! **Key.** Everything that changes NVRTC's output, length-prefixed so that no two inputs encode
//! alike: the entry format, NVRTC's version, the target (cubin or PTX, and the architecture), the
//! program's name and text, every header's name and contents, every option and every name
//! expression, in order. The key is the XXH3-128 hash of that encoding, and the entry's file name
//! is the key in hex (`<32 hex digits>.atlas`). NVRTC's version is what `nvrtcVersion` reports,
//! major and minor: two patch releases of one minor version share entries (clear the directory
//! after such an update if their output differs).
//!
//! **Why XXH3-128.** A hit must cost little beside the module load (a few microseconds), and the
//! key hashes the whole source on every lookup: XXH3 reads many gigabytes a second in plain Rust
//! (SHA-256 in software, a few hundred megabytes), and 128 bits make an accidental collision as
//! likely as none (about 2^-64 for four billion entries). The key is not a security boundary: who
//! can write the cache directory can put any code in it, whatever the hash, so the directory's
//! permissions are what protect it. The `xxhash-rust` crate is pure Rust, has no dependencies of
//! its own, and its output is fixed by the XXH3 specification, so keys do not change with the
//! toolchain (as `std`'s `DefaultHasher` may).
//!
//! **Entry.** The code, the lowered names, then a 44-byte header (magic `ATLASNVC`, format version,
//! code kind, code length, the number of lowered names, and the XXH3-128 checksum of everything
//! before the header). The code comes first so that a hit hands the bytes it read to the driver
//! as they are, without moving a 150 KB cubin of 100 kernels to the front of its buffer; the
//! header last, so that an entry cut short has none. An entry is used only when its header,
//! checksum, names and length agree and its code passes the blob validator ([`validate_blob`]),
//! before the driver sees it; otherwise it is compiled again and replaced
//! ([`CacheOutcome::Replaced`]), never loaded.
//!
//! **Publication.** An entry is written to a temporary file of its own in the same directory
//! (named for the process and a counter) and renamed over the entry's name: a rename within a
//! directory is atomic, so a concurrent reader, thread or process, finds the old entry, the new
//! one or none, never part of one. Two processes that compile the same source at once both write
//! the same bytes; the last rename wins. Nothing is synced to disk: an entry cut short by a crash
//! of the machine fails its checksum and is compiled again.
//!
//! **Bound.** After each store, when the entries add up to more than the cache's limit, the least
//! recently used are removed until they fit (a hit sets the entry's modification time to now, so
//! the modification times order the entries by use); the entry just stored is kept.
//! Temporary files an interrupted process left are removed after an hour.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::code::blob::{BlobKind, validate_blob};
use crate::compile::{CompileTarget, CompiledCode, CudaSource};

/// The environment variable that names the cache directory.
pub const CACHE_DIR_VAR: &str = "ATLAS_CACHE_DIR";
/// The environment variable that turns the cache off (any value but empty or `0`).
pub const CACHE_DISABLE_VAR: &str = "ATLAS_CACHE_DISABLE";
/// The environment variable that sets the cache's size limit in bytes.
pub const CACHE_MAX_BYTES_VAR: &str = "ATLAS_CACHE_MAX_BYTES";

/// The size limit of a cache when none is set: 512 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;

const MAGIC: &[u8; 8] = b"ATLASNVC";
const FORMAT: u32 = 2;
const HEADER: usize = 44;
const EXTENSION: &str = "atlas";
const TEMP_EXTENSION: &str = "tmp";
/// How old a temporary file must be before eviction takes it for an interrupted process's.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Where compiled code is kept between runs, and how much of it.
///
/// ```
/// use atlas_registry::CompileCache;
///
/// let cache = CompileCache::at("/tmp/my-app-kernels").max_bytes(64 << 20);
/// assert_eq!(cache.dir(), Some(std::path::Path::new("/tmp/my-app-kernels")));
/// assert_eq!(CompileCache::disabled().dir(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    max_bytes: u64,
}

/// What the cache did for one compile ([`CompiledCode::cache_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheOutcome {
    /// The cache is off: compiled, nothing stored.
    Off,
    /// Found in the cache: nothing was compiled.
    Hit,
    /// Not in the cache: compiled and stored.
    Stored,
    /// The entry could not be used (why: truncated, a checksum that does not match, a blob the
    /// validator refuses): compiled again, and the entry replaced.
    Replaced {
        /// What was wrong with the entry.
        reason: String,
    },
    /// Compiled, but the entry could not be written (why: the directory is read-only, full...).
    /// The compile itself succeeded.
    NotStored {
        /// The error.
        reason: String,
    },
}

impl CompileCache {
    /// The cache the environment asks for: off when `ATLAS_CACHE_DISABLE` is set (to anything
    /// but empty or `0`); else in `ATLAS_CACHE_DIR` when it is set, else in the user's cache
    /// directory (`$XDG_CACHE_HOME/atlas/kernels`, else `~/.cache/atlas/kernels`;
    /// `%LOCALAPPDATA%\atlas\kernels` on Windows), off when there is none. Its limit is
    /// `ATLAS_CACHE_MAX_BYTES` when that is a number, else [`DEFAULT_MAX_BYTES`].
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let off = var(CACHE_DISABLE_VAR).is_some_and(|v| v != "0");
        let dir = if off {
            None
        } else {
            var(CACHE_DIR_VAR)
                .map(PathBuf::from)
                .or_else(user_cache_dir)
        };
        let max_bytes = var(CACHE_MAX_BYTES_VAR)
            .and_then(|v| v.to_str()?.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES);
        Self { dir, max_bytes }
    }

    /// A cache in `dir` (created when first stored to), of [`DEFAULT_MAX_BYTES`].
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// No cache: every compile runs NVRTC, and nothing is stored.
    pub fn disabled() -> Self {
        Self {
            dir: None,
            max_bytes: 0,
        }
    }

    /// The same cache, holding at most `bytes` of entries (the entry just stored is always kept).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The directory, or `None` when the cache is off.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The size limit in bytes.
    pub fn limit(&self) -> u64 {
        self.max_bytes
    }

    /// The entry `key` names, when there is a usable one.
    pub(crate) fn look_up(&self, key: &Key, expressions: &[String]) -> Lookup {
        let Some(dir) = &self.dir else {
            return Lookup::Off;
        };
        let path = key.path(dir);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Unusable(format!("cannot open {}: {e}", path.display())),
        };
        let mut bytes = Vec::new();
        if let Err(e) = file.read_to_end(&mut bytes) {
            return Lookup::Unusable(format!("cannot read {}: {e}", path.display()));
        }
        match parse(&bytes, key.kind(), expressions) {
            Ok((lowered, code_len)) => {
                // Its use, for the least-recently-used order; a cache shared with other users
                // may not let this process change the time, which costs only that order.
                let _ = file.set_modified(SystemTime::now());
                bytes.truncate(code_len);
                Lookup::Hit {
                    code: bytes,
                    lowered,
                }
            }
            Err(reason) => Lookup::Unusable(format!("{}: {reason}", path.display())),
        }
    }

    /// Stores `code` as the entry of `key` (after `looked` found none usable) and evicts what no
    /// longer fits; what the cache did.
    pub(crate) fn store(&self, key: &Key, code: &CompiledCode, looked: Lookup) -> CacheOutcome {
        let Some(dir) = &self.dir else {
            return CacheOutcome::Off;
        };
        if let Err(reason) = publish(dir, key, code) {
            return CacheOutcome::NotStored { reason };
        }
        evict(dir, self.max_bytes, &key.path(dir));
        match looked {
            Lookup::Unusable(reason) => CacheOutcome::Replaced { reason },
            _ => CacheOutcome::Stored,
        }
    }
}

/// The user's cache directory for Atlas's kernels, when the platform has one.
fn user_cache_dir() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = if cfg!(windows) {
        var("LOCALAPPDATA")
    } else if cfg!(target_os = "macos") {
        var("HOME").map(|home| home.join("Library/Caches"))
    } else {
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|home| home.join(".cache")))
    };
    Some(base?.join("atlas").join("kernels"))
}

/// The key of one compile (see the module docs).
pub(crate) struct Key {
    hash: u128,
    target: CompileTarget,
}

impl Key {
    /// The key of compiling `source` for `target` with NVRTC `version`.
    pub(crate) fn new(source: &CudaSource, target: CompileTarget, version: (u32, u32)) -> Self {
        let mut h = Xxh3::new();
        let mut bytes = |b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        bytes(MAGIC);
        bytes(&FORMAT.to_le_bytes());
        bytes(&version.0.to_le_bytes());
        bytes(&version.1.to_le_bytes());
        let (kind, arch) = match target {
            CompileTarget::Cubin { arch } => (b"cubin".as_slice(), arch),
            CompileTarget::Ptx { arch } => (b"ptx".as_slice(), arch),
        };
        bytes(kind);
        bytes(&arch.to_le_bytes());
        bytes(source.name.as_bytes());
        bytes(source.text.as_bytes());
        for list in [&source.options, &source.name_expressions] {
            bytes(&(list.len() as u64).to_le_bytes());
            for item in list {
                bytes(item.as_bytes());
            }
        }
        bytes(&(source.headers.len() as u64).to_le_bytes());
        for (name, contents) in &source.headers {
            bytes(name.as_bytes());
            bytes(contents.as_bytes());
        }
        Self {
            hash: h.digest128(),
            target,
        }
    }

    /// The key as 32 hex digits.
    pub(crate) fn hex(&self) -> String {
        format!("{:032x}", self.hash)
    }

    fn path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.{EXTENSION}", self.hex()))
    }

    fn kind(&self) -> u32 {
        match self.target {
            CompileTarget::Cubin { .. } => 2,
            CompileTarget::Ptx { .. } => 1,
        }
    }
}

/// What a lookup found.
pub(crate) enum Lookup {
    /// The cache is off.
    Off,
    /// No entry.
    Miss,
    /// An entry that cannot be used, and why.
    Unusable(String),
    /// A usable entry: its code and the lowered names.
    Hit {
        code: Vec<u8>,
        lowered: Vec<(String, String)>,
    },
}

/// The bytes of the entry for `code`.
fn encode(kind: u32, code: &CompiledCode) -> Vec<u8> {
    let image = code.image();
    let mut entry = Vec::with_capacity(image.len() + 64 * code.lowered.len() + HEADER);
    entry.extend_from_slice(image);
    for (expression, lowered) in &code.lowered {
        for s in [expression, lowered] {
            entry.extend_from_slice(&(s.len() as u32).to_le_bytes());
            entry.extend_from_slice(s.as_bytes());
        }
    }
    let checksum = xxh3_128(&entry);
    entry.extend_from_slice(MAGIC);
    entry.extend_from_slice(&FORMAT.to_le_bytes());
    entry.extend_from_slice(&kind.to_le_bytes());
    entry.extend_from_slice(&(image.len() as u64).to_le_bytes());
    entry.extend_from_slice(&(code.lowered.len() as u32).to_le_bytes());
    entry.extend_from_slice(&checksum.to_le_bytes());
    entry
}

/// An entry's lowered names, and the length of its code (which starts it).
type Parsed = (Vec<(String, String)>, usize);

/// Checks an entry (see the module docs) and returns its lowered names and the length of its code.
fn parse(entry: &[u8], kind: u32, expressions: &[String]) -> Result<Parsed, String> {
    let Some(body_len) = entry.len().checked_sub(HEADER) else {
        return Err(format!(
            "{} bytes, shorter than an entry's header (truncated)",
            entry.len()
        ));
    };
    let (body, header) = entry.split_at(body_len);
    let u32_at = |at: usize| -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&header[at..at + 4]);
        u32::from_le_bytes(b)
    };
    if &header[..8] != MAGIC || u32_at(8) != FORMAT {
        return Err(
            "its last bytes are not the header of an entry of this cache's format (truncated, or \
             another format)"
                .into(),
        );
    }
    if u32_at(12) != kind {
        return Err(format!("holds code of kind {}, not {kind}", u32_at(12)));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[16..24]);
    let code_len = u64::from_le_bytes(len);
    let names = u32_at(24) as usize;
    let mut sum = [0u8; 16];
    sum.copy_from_slice(&header[28..44]);
    if xxh3_128(body) != u128::from_le_bytes(sum) {
        return Err("its checksum does not match its contents (truncated or corrupt)".into());
    }
    let Some(code_len) = usize::try_from(code_len).ok().filter(|&n| n <= body.len()) else {
        return Err(format!(
            "it declares {code_len} bytes of code and holds {}",
            body.len()
        ));
    };
    let (code, mut rest) = body.split_at(code_len);
    let mut string = || -> Result<String, String> {
        let past = "a lowered name runs past the end";
        let (len, tail) = rest.split_at_checked(4).ok_or(past)?;
        let len = u32::from_le_bytes(len.try_into().map_err(|_| past)?) as usize;
        let (bytes, tail) = tail.split_at_checked(len).ok_or(past)?;
        rest = tail;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a lowered name is not UTF-8".to_string())
    };
    let mut lowered = Vec::with_capacity(names.min(expressions.len()));
    for _ in 0..names {
        let expression = string()?;
        lowered.push((expression, string()?));
    }
    if !lowered.iter().map(|(e, _)| e).eq(expressions) {
        return Err("its name expressions are not the source's".into());
    }
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes follow its lowered names (corrupt)",
            rest.len()
        ));
    }
    let expected = if kind == 2 {
        BlobKind::Cubin
    } else {
        BlobKind::Ptx
    };
    match validate_blob("cache entry", code) {
        Ok(found) if found == expected => Ok((lowered, code_len)),
        Ok(found) => Err(format!("its code is {found:?}, not {expected:?}")),
        Err(e) => Err(format!("its code is refused: {e}")),
    }
}

/// Writes the entry of `key` through a temporary file renamed into place.
fn publish(dir: &Path, key: &Key, code: &CompiledCode) -> Result<(), String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let temp = dir.join(format!(
        "{}.{}.{}.{TEMP_EXTENSION}",
        key.hex(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = File::create_new(&temp)
        .and_then(|mut file| file.write_all(&encode(key.kind(), code)))
        .and_then(|()| fs::rename(&temp, key.path(dir)));
    written.map_err(|e| {
        let _ = fs::remove_file(&temp);
        format!("cannot write {}: {e}", key.path(dir).display())
    })
}

/// Removes the least recently used entries of `dir` until they add up to at most `max_bytes`
/// (never `keep`, the entry just stored), and temporary files older than [`STALE_TEMP`].
fn evict(dir: &Path, max_bytes: u64, keep: &Path) {
    let Ok(listing) = fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    let mut entries = Vec::new();
    let mut total = 0u64;
    for item in listing.flatten() {
        let path = item.path();
        let Ok(meta) = item.metadata() else { continue };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        match path.extension().and_then(|e| e.to_str()) {
            Some(EXTENSION) => {
                total += meta.len();
                if path != keep {
                    entries.push((modified, meta.len(), path));
                }
            }
            Some(TEMP_EXTENSION)
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TEMP) =>
            {
                let _ = fs::remove_file(&path);
            }
            _ => {}
        }
    }
    if total <= max_bytes {
        return;
    }
    entries.sort_unstable();
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> CudaSource {
        CudaSource::new("k.cu", "__global__ void k() {}")
            .header("h.h", "#define A 1")
            .option("-DB=2")
            .name_expression("k")
    }

    const SM_90: CompileTarget = CompileTarget::Cubin { arch: 90 };

    #[test]
    fn the_key_changes_with_everything_that_changes_the_output() {
        let base = Key::new(&source(), SM_90, (12, 0)).hash;
        let changed = [
            Key::new(
                &CudaSource::new("j.cu", source().text.clone()),
                SM_90,
                (12, 0),
            ),
            Key::new(&source().option("-DC=3"), SM_90, (12, 0)),
            Key::new(&source().header("i.h", ""), SM_90, (12, 0)),
            Key::new(&source().name_expression("k2"), SM_90, (12, 0)),
            Key::new(&source(), CompileTarget::Cubin { arch: 80 }, (12, 0)),
            Key::new(&source(), CompileTarget::Ptx { arch: 90 }, (12, 0)),
            Key::new(&source(), SM_90, (12, 9)),
            Key::new(&source(), SM_90, (13, 0)),
        ];
        for key in &changed {
            assert_ne!(key.hash, base);
        }
        assert_eq!(Key::new(&source(), SM_90, (12, 0)).hash, base, "stable");
        // Length prefixes: moving a byte from one field to the next changes the key.
        let a = CudaSource::new("ab", "c");
        let b = CudaSource::new("a", "bc");
        assert_ne!(
            Key::new(&a, SM_90, (12, 0)).hash,
            Key::new(&b, SM_90, (12, 0)).hash
        );
        let a = source().option("-DX").option("Y");
        let b = source().option("-DXY");
        assert_ne!(
            Key::new(&a, SM_90, (12, 0)).hash,
            Key::new(&b, SM_90, (12, 0)).hash
        );
    }

    #[test]
    fn a_disabled_cache_has_no_directory() {
        assert_eq!(CompileCache::disabled().dir(), None);
        assert_eq!(CompileCache::at("/x").limit(), DEFAULT_MAX_BYTES);
        assert_eq!(CompileCache::at("/x").max_bytes(7).limit(), 7);
    }

    fn code(image: &[u8]) -> CompiledCode {
        CompiledCode {
            target: SM_90,
            bytes: image.to_vec(),
            lowered: vec![("k".into(), "_Z1kv".into())],
            log: String::new(),
            cache: CacheOutcome::Off,
        }
    }

    #[test]
    fn an_entry_round_trips_and_its_checks_refuse_what_is_wrong() {
        let (_, cubin) = atlas_kernels::cubin_for_model("demo", 90).unwrap()[1];
        let names = ["k".to_string()];
        let entry = encode(2, &code(cubin));
        let (lowered, code_len) = parse(&entry, 2, &names).unwrap();
        assert_eq!(lowered, code(cubin).lowered);
        assert_eq!(&entry[..code_len], cubin);
        // Asked for as PTX, or with other name expressions: not this entry.
        assert!(parse(&entry, 1, &names).unwrap_err().contains("kind"));
        assert!(
            parse(&entry, 2, &[])
                .unwrap_err()
                .contains("name expressions")
        );
        // A whole entry (its checksum right) around code the blob validator refuses is refused
        // too, before the driver could see it.
        let cut = encode(2, &code(&cubin[..cubin.len() / 2]));
        let why = parse(&cut, 2, &names).unwrap_err();
        assert!(
            why.contains("refused") && why.contains("truncated"),
            "{why}"
        );
        // Code of another kind than the entry says.
        let ptx = encode(2, &code(b".version 8.0\n.target sm_90\n\0"));
        assert!(parse(&ptx, 2, &names).unwrap_err().contains("not Cubin"));
    }
}
