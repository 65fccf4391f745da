//! [`CompileCache`]: the persistent, content-addressed cache of what NVRTC made.
//!
//! **Key.** Everything that changes NVRTC's output, length-prefixed so that no two inputs encode
//! alike: the entry format, NVRTC's version, the target (cubin or PTX, and the architecture), the
//! program's name and text, every header's name and contents (the headers given in memory, which
//! NVRTC reads before any file: [`CudaSource::header`]), every option and every name expression,
//! in order. The key is the XXH3-128 hash of that encoding, and the entry's file name is the key
//! in hex (`<32 hex digits>.atlas`). NVRTC's version is what `nvrtcVersion` reports, major and
//! minor: two patch releases of one minor version share entries (clear the directory after such
//! an update if their output differs). A source for which NVRTC may read a file from disk (an
//! include path, a pre-included header, an `#include` of a name not given in memory) is compiled
//! every time and never cached ([`CacheOutcome::ReadsFiles`], `file_reads.rs` says why): files
//! are not in the key, and a changed header must not bring back the old code.
//!
//! **Why XXH3-128.** A hit must cost little beside the module load (a few microseconds), and the
//! key hashes the whole source on every lookup: XXH3 reads many gigabytes a second in plain Rust
//! (SHA-256 in software, a few hundred megabytes), and 128 bits make an accidental collision as
//! likely as none (about 2^-64 for four billion entries). The key is no MAC and not a security
//! boundary: who can write the cache directory can put any code in it, whatever the hash. What
//! protects the cache is that Atlas uses only a directory of the process's own user that no one
//! else may write to, and makes its directories 0700 and its entries 0600 (`cache_dir.rs`:
//! [`Distrust`] says why a directory is not used, [`CompileCache::shared`] opts in to a directory
//! shared with people one trusts). The `xxhash-rust` crate is pure Rust, has no dependencies of
//! its own, and its output is fixed by the XXH3 specification, so keys do not change with the
//! toolchain (as `std`'s `DefaultHasher` may).
//!
//! **Entry.** The code, the lowered names, then a 44-byte header (magic `ATLASNVC`, format version,
//! code kind, code length, the number of lowered names, and the XXH3-128 checksum of everything
//! before the header). The code comes first so that a hit hands the bytes it read to the driver
//! as they are, without moving a 150 KB cubin of 100 kernels to the front of its buffer; the
//! header last, so that an entry cut short has none. An entry is read only when it is a regular
//! file (not through a link, never waiting on a FIFO) of at most 1 GiB, and used only when its
//! header, checksum, names and length agree and its code passes the blob validator
//! ([`validate_blob`]), before the driver sees it; otherwise it is compiled again and replaced
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
//! Temporary files an interrupted process left are removed after an hour. Eviction removes only
//! files of the names Atlas writes, in a directory Atlas made (its marker, `CACHEDIR.TAG`, is in
//! it): never another file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::code::blob::{BlobKind, validate_blob};
use crate::compile::cache_dir::{
    CacheDir, Distrust, MAX_ENTRY_BYTES, Refusal, entry_name, temp_name,
};
use crate::compile::{CompileTarget, CompiledCode, CudaSource, FileRead};

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

/// Where compiled code is kept between runs, and how much of it.
///
/// The directory must be the process's user's own, writable by no one else: a directory Atlas
/// makes is (0700), and one that is not is not used ([`CacheOutcome::Untrusted`]), since whoever
/// can write to it can put code in it that this process would run. The default
/// ([`from_env`](Self::from_env)) is the user's own cache directory.
///
/// ```
/// use atlas_registry::CompileCache;
///
/// // A directory of the user's own (never a shared one such as /tmp, which others can write).
/// let home = std::env::var_os("HOME").unwrap_or_default();
/// let dir = std::path::Path::new(&home).join(".cache/my-app/kernels");
/// let cache = CompileCache::at(&dir).max_bytes(64 << 20);
/// assert_eq!(cache.dir(), Some(dir.as_path()));
/// assert_eq!(CompileCache::disabled().dir(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    max_bytes: u64,
    shared: bool,
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
    /// Compiled, and neither looked up nor stored: NVRTC may read a file from disk for this
    /// source, and files are not in the key (so a changed header could bring back old code).
    /// Give the headers with [`CudaSource::header`] to have such a source cached.
    ReadsFiles {
        /// What makes NVRTC read a file.
        reason: FileRead,
    },
    /// Compiled, and the directory neither read nor written: someone other than this process's
    /// user could have put code in it.
    Untrusted {
        /// The directory.
        dir: PathBuf,
        /// Why it is not used.
        reason: Distrust,
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
        Self {
            dir,
            max_bytes,
            shared: false,
        }
    }

    /// A cache in `dir`, of [`DEFAULT_MAX_BYTES`]. A missing directory is made when first
    /// stored to, with mode 0700 (its missing parents too); an existing one is used only when
    /// this process's user owns it and neither group nor others may write to it.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            max_bytes: DEFAULT_MAX_BYTES,
            shared: false,
        }
    }

    /// No cache: every compile runs NVRTC, and nothing is stored.
    pub fn disabled() -> Self {
        Self {
            dir: None,
            max_bytes: 0,
            shared: false,
        }
    }

    /// The same cache, in a directory shared with other users: it is used whoever owns it and
    /// when its group may write to it (a team's cache, say, in a directory of their group).
    ///
    /// Every user who can write to the directory can then put code in it that this process
    /// loads and runs: use this only for a directory whose writers you trust as you trust your
    /// own files. What still holds: a directory every user may write to (mode `o+w`, as `/tmp`)
    /// is refused ([`Distrust::WritableByAll`]); an entry is read only when it is a regular file
    /// (never through a link, never waiting on a FIFO, at most 1 GiB) and used only when its
    /// checksum, names and code pass the same checks as in a private cache, so a malformed entry
    /// never reaches the driver; eviction removes only files of Atlas's names. Entries are
    /// written with mode 0644, for the others to read; Atlas makes a missing directory 0700 all
    /// the same (who shares it sets its group and mode).
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Whether the cache trusts a directory shared with other users ([`shared`](Self::shared)).
    pub fn is_shared(&self) -> bool {
        self.shared
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
        let Some(path) = &self.dir else {
            return Lookup::Off;
        };
        let dir = match CacheDir::open(path, self.shared) {
            Ok(dir) => dir,
            Err(Refusal::Untrusted(reason)) => return Lookup::Untrusted(reason),
            // Made, or the error reported, when the entry is stored.
            Err(Refusal::Missing | Refusal::Failed(_)) => {
                return Lookup::Miss {
                    dir: None,
                    unusable: None,
                };
            }
        };
        let name = entry_name(&key.hex());
        let unusable = match dir.read(&name, MAX_ENTRY_BYTES) {
            Ok(None) => None,
            Ok(Some((file, mut bytes))) => match parse(&bytes, key.kind(), expressions) {
                Ok((lowered, code_len)) => {
                    // Its use, for the least-recently-used order; a cache shared with other
                    // users may not let this process change the time, which costs only that
                    // order.
                    let _ = file.set_modified(SystemTime::now());
                    bytes.truncate(code_len);
                    return Lookup::Hit {
                        code: bytes,
                        lowered,
                    };
                }
                Err(reason) => Some(reason),
            },
            Err(reason) => Some(reason),
        };
        Lookup::Miss {
            unusable: unusable.map(|reason| format!("{}: {reason}", dir.shown(&name).display())),
            dir: Some(dir),
        }
    }

    /// Stores `code` as the entry of `key` (after `looked` found none usable) and evicts what no
    /// longer fits; what the cache did.
    pub(crate) fn store(&self, key: &Key, code: &CompiledCode, looked: Lookup) -> CacheOutcome {
        let Some(path) = &self.dir else {
            return CacheOutcome::Off;
        };
        let untrusted = |reason| CacheOutcome::Untrusted {
            dir: path.clone(),
            reason,
        };
        let (dir, unusable) = match looked {
            Lookup::Off => return CacheOutcome::Off,
            Lookup::Hit { .. } => return CacheOutcome::Hit,
            Lookup::Untrusted(reason) => return untrusted(reason),
            Lookup::Miss { dir, unusable } => (dir, unusable),
        };
        let dir = match dir.map_or_else(|| CacheDir::create(path, self.shared), Ok) {
            Ok(dir) => dir,
            Err(Refusal::Untrusted(reason)) => return untrusted(reason),
            Err(Refusal::Failed(reason)) => return CacheOutcome::NotStored { reason },
            Err(Refusal::Missing) => {
                return CacheOutcome::NotStored {
                    reason: format!("{} vanished", path.display()),
                };
            }
        };
        let name = entry_name(&key.hex());
        let entry = encode(key.kind(), code);
        if entry.len() as u64 > MAX_ENTRY_BYTES {
            return CacheOutcome::NotStored {
                reason: format!(
                    "{} bytes, more than an entry may hold ({MAX_ENTRY_BYTES})",
                    entry.len()
                ),
            };
        }
        if let Err(e) = dir.publish(&name, &temp_name(&key.hex()), &entry) {
            return CacheOutcome::NotStored {
                reason: format!("cannot write {}: {e}", dir.shown(&name).display()),
            };
        }
        dir.evict(self.max_bytes, &name);
        match unusable {
            Some(reason) => CacheOutcome::Replaced { reason },
            None => CacheOutcome::Stored,
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
    /// The directory is not to be used, and why.
    Untrusted(Distrust),
    /// No usable entry: the directory, when it could be opened, and why an entry that is there
    /// could not be used.
    Miss {
        dir: Option<CacheDir>,
        unusable: Option<String>,
    },
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

/// The threats to a cache directory, one test each: entries others put there, modes, FIFOs and
/// links at entry names, others' files under eviction, file sizes a sparse file claims.
#[cfg(all(test, unix))]
mod directory_tests {
    use std::fs::{self, File};
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::sync::mpsc;
    use std::time::{Duration, SystemTime};

    use super::*;

    const SM_90: CompileTarget = CompileTarget::Cubin { arch: 90 };

    /// A fresh directory under the temporary directory, mode 0700, removed with what it holds
    /// when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("atlas-cache-dir-{}-{test}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir(&path).unwrap();
            chmod(&path, 0o700);
            Self(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn source(i: usize) -> CudaSource {
        CudaSource::new(format!("k{i}.cu"), "__global__ void k() {}").name_expression("k")
    }

    fn key(i: usize) -> Key {
        Key::new(&source(i), SM_90, (12, 0))
    }

    fn names() -> [String; 1] {
        ["k".to_string()]
    }

    /// A valid entry: a real cubin, the lowered name `k` has.
    fn code() -> CompiledCode {
        let (_, cubin) = atlas_kernels::cubin_for_model("demo", 90).unwrap()[1];
        CompiledCode {
            target: SM_90,
            bytes: cubin.to_vec(),
            lowered: vec![("k".into(), "_Z1kv".into())],
            log: String::new(),
            cache: CacheOutcome::Off,
        }
    }

    fn entry_path(dir: &Path, key: &Key) -> PathBuf {
        dir.join(entry_name(&key.hex()))
    }

    fn what(lookup: &Lookup) -> String {
        match lookup {
            Lookup::Off => "Off".into(),
            Lookup::Untrusted(why) => format!("Untrusted({why})"),
            Lookup::Miss { unusable, .. } => format!("Miss({unusable:?})"),
            Lookup::Hit { .. } => "Hit".into(),
        }
    }

    /// Looks `key` up in `cache` and stores `code()` when it misses, on a thread of its own;
    /// what the lookup found and what the store did, or a panic when that takes over 5 s.
    fn look_up_and_store(cache: &CompileCache, key: Key) -> (String, Option<CacheOutcome>) {
        let (cache, (sender, receiver)) = (cache.clone(), mpsc::channel());
        std::thread::spawn(move || {
            let looked = cache.look_up(&key, &names());
            let found = what(&looked);
            let stored =
                (!matches!(looked, Lookup::Hit { .. })).then(|| cache.store(&key, &code(), looked));
            let _ = sender.send((found, stored));
        });
        receiver
            .recv_timeout(Duration::from_secs(5))
            .expect("the lookup did not return within 5 s")
    }

    #[test]
    fn an_entry_planted_in_a_directory_others_can_write_is_not_used() {
        let dir = Scratch::new("planted");
        let planted = encode(2, &code());
        fs::write(entry_path(&dir.0, &key(0)), &planted).unwrap();
        for (mode, why) in [(0o777, "0777"), (0o775, "0775"), (0o1777, "1777")] {
            chmod(&dir.0, mode);
            let (found, stored) = look_up_and_store(&CompileCache::at(&dir.0), key(0));
            assert!(
                found.starts_with("Untrusted") && found.contains(why),
                "mode {mode:o}: {found}"
            );
            assert!(
                matches!(&stored, Some(CacheOutcome::Untrusted { dir: d, reason: Distrust::Writable { .. } }) if d == &dir.0),
                "mode {mode:o}: {stored:?}"
            );
            assert_eq!(fs::read(entry_path(&dir.0, &key(0))).unwrap(), planted);
            assert_eq!(
                fs::read_dir(&dir.0).unwrap().count(),
                1,
                "nothing was written"
            );
        }
        // A shared cache trusts its group, never everybody.
        chmod(&dir.0, 0o775);
        let shared = CompileCache::at(&dir.0).shared();
        assert_eq!(look_up_and_store(&shared, key(0)).0, "Hit");
        chmod(&dir.0, 0o777);
        let (found, _) = look_up_and_store(&shared, key(0));
        assert!(found.contains("every user"), "{found}");
        // A directory of another user's (when this process may give one away).
        chmod(&dir.0, 0o700);
        if std::os::unix::fs::chown(&dir.0, Some(65534), None).is_ok() {
            let (found, stored) = look_up_and_store(&CompileCache::at(&dir.0), key(0));
            assert!(found.contains("belongs to user 65534"), "{found}");
            assert!(
                matches!(
                    stored,
                    Some(CacheOutcome::Untrusted {
                        reason: Distrust::NotOwned { owner: 65534, .. },
                        ..
                    })
                ),
                "{stored:?}"
            );
        }
    }

    #[test]
    fn directories_are_made_0700_and_entries_0600() {
        let scratch = Scratch::new("modes");
        let parent = scratch.0.join("made");
        let dir = parent.join("cache");
        let (_, stored) = look_up_and_store(&CompileCache::at(&dir), key(0));
        assert_eq!(stored, Some(CacheOutcome::Stored));
        let entry = entry_path(&dir, &key(0));
        assert_eq!(
            (mode(&parent), mode(&dir), mode(&entry)),
            (0o700, 0o700, 0o600),
            "parent, directory, entry"
        );
        assert_eq!(
            fs::read(dir.join("CACHEDIR.TAG")).unwrap()[..43],
            *b"Signature: 8a477f597d28d172789f06886806bc55"
        );
        // A shared cache's entries are for the others to read; its directory is still 0700 when
        // Atlas makes it.
        let shared_dir = scratch.0.join("shared");
        let shared = CompileCache::at(&shared_dir).shared();
        assert_eq!(
            look_up_and_store(&shared, key(0)).1,
            Some(CacheOutcome::Stored)
        );
        assert_eq!(
            (mode(&shared_dir), mode(&entry_path(&shared_dir, &key(0)))),
            (0o700, 0o644)
        );
    }

    #[test]
    fn a_fifo_at_an_entry_name_returns_at_once_and_is_replaced() {
        let dir = Scratch::new("fifo");
        let entry = entry_path(&dir.0, &key(0));
        let made = std::process::Command::new("mkfifo").arg(&entry).status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "mkfifo {}",
            entry.display()
        );
        let cache = CompileCache::at(&dir.0);
        let (found, stored) = look_up_and_store(&cache, key(0));
        assert!(found.contains("not a regular file (a FIFO)"), "{found}");
        assert!(
            matches!(&stored, Some(CacheOutcome::Replaced { reason }) if reason.contains("FIFO")),
            "{stored:?}"
        );
        assert!(fs::symlink_metadata(&entry).unwrap().is_file());
        assert_eq!(look_up_and_store(&cache, key(0)).0, "Hit");
    }

    #[test]
    fn links_at_entry_names_are_not_followed_and_entries_are_read_within_their_size() {
        let dir = Scratch::new("links");
        let elsewhere = Scratch::new("links-target");
        let target = elsewhere.0.join("entry");
        fs::write(&target, encode(2, &code())).unwrap();
        let cache = CompileCache::at(&dir.0);
        for (i, to) in [Path::new("/dev/zero"), &target].into_iter().enumerate() {
            let entry = entry_path(&dir.0, &key(i));
            symlink(to, &entry).unwrap();
            let (found, stored) = look_up_and_store(&cache, key(i));
            assert!(
                found.contains("a symbolic link"),
                "{}: {found}",
                to.display()
            );
            assert!(
                matches!(stored, Some(CacheOutcome::Replaced { .. })),
                "{stored:?}"
            );
            assert!(
                fs::symlink_metadata(&entry).unwrap().is_file(),
                "the link was replaced"
            );
        }
        assert_eq!(
            fs::read(&target).unwrap(),
            encode(2, &code()),
            "its target is untouched"
        );
        // A regular file longer than any entry is refused by its size, unread.
        let huge = entry_path(&dir.0, &key(2));
        File::create(&huge)
            .unwrap()
            .set_len(MAX_ENTRY_BYTES + 1)
            .unwrap();
        let (found, _) = look_up_and_store(&cache, key(2));
        assert!(found.contains("more than an entry may hold"), "{found}");
    }

    #[test]
    fn eviction_removes_only_atlas_files_from_atlas_directories() {
        let hours_ago = SystemTime::now() - Duration::from_secs(7200);
        let others = [
            "notes.atlas",
            "scratch.tmp",
            "results.atlas.bak",
            "0123456789ABCDEF0123456789ABCDEF.atlas",
            "0123456789abcdef0123456789abcdef.atlas.tmp",
        ];
        let put = |dir: &Path, name: &str| {
            let file = File::create(dir.join(name)).unwrap();
            file.set_len(1000).unwrap();
            file.set_modified(hours_ago).unwrap();
        };
        // A directory Atlas did not make, with others' files: nothing of theirs is removed, and
        // Atlas does not mark it as its own.
        let theirs = Scratch::new("others");
        for name in others {
            put(&theirs.0, name);
        }
        let tiny = CompileCache::at(&theirs.0).max_bytes(1);
        for i in 0..3 {
            assert_eq!(
                look_up_and_store(&tiny, key(i)).1,
                Some(CacheOutcome::Stored)
            );
        }
        for name in others {
            assert!(theirs.0.join(name).exists(), "eviction removed {name}");
        }
        assert!(!theirs.0.join("CACHEDIR.TAG").exists());
        // In Atlas's own directory eviction works, and still spares a file someone put there.
        let scratch = Scratch::new("own");
        let own = scratch.0.join("cache");
        let tiny = CompileCache::at(&own).max_bytes(1);
        assert_eq!(
            look_up_and_store(&tiny, key(0)).1,
            Some(CacheOutcome::Stored)
        );
        put(&own, "notes.atlas");
        let stale_temp = format!("{}.123.4.tmp", key(9).hex());
        put(&own, &stale_temp);
        assert_eq!(
            look_up_and_store(&tiny, key(1)).1,
            Some(CacheOutcome::Stored)
        );
        assert!(
            !entry_path(&own, &key(0)).exists(),
            "the older entry was evicted"
        );
        assert!(
            !own.join(&stale_temp).exists(),
            "a stale temporary file of Atlas's was removed"
        );
        assert!(entry_path(&own, &key(1)).exists() && own.join("notes.atlas").exists());
    }

    #[test]
    fn huge_sparse_files_at_entry_names_do_not_overflow_evictions_sum() {
        let scratch = Scratch::new("sparse");
        let dir = scratch.0.join("cache");
        let cache = CompileCache::at(&dir).max_bytes(1 << 20);
        assert_eq!(
            look_up_and_store(&cache, key(0)).1,
            Some(CacheOutcome::Stored)
        );
        // As long as the file system lets a file claim (2^63 - 1 on tmpfs, 16 TiB on ext4).
        let mut claimed = i64::MAX as u64;
        for i in 1..=3 {
            let file = File::create(entry_path(&dir, &key(i))).unwrap();
            while file.set_len(claimed).is_err() {
                assert!(claimed > 1 << 30, "no sparse file of more than 1 GiB here");
                claimed /= 2;
            }
        }
        assert_eq!(
            look_up_and_store(&cache, key(4)).1,
            Some(CacheOutcome::Stored)
        );
        for i in 1..=3 {
            assert!(!entry_path(&dir, &key(i)).exists(), "{i}: evicted");
        }
        assert!(entry_path(&dir, &key(4)).exists());
    }
}
