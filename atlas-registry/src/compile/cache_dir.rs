//! The compile cache's directory on disk: whether it may be used, and how entries are read,
//! written and evicted in it. Whoever can write to the directory can put code in it that Atlas
//! loads and runs, whatever the key (a hash, not a signature), so the directory's ownership and
//! permissions are what protect the cache, as CUDA's own JIT cache relies on a per-user
//! `~/.nv/ComputeCache` of mode 0700.
//!
//! **Trust.** A directory is used when this process's (effective) user owns it and neither group
//! nor others may write to it ([`Distrust`] says why one is not). A shared cache
//! ([`CompileCache::shared`]) trusts every user who may write to it, and still refuses a
//! directory that every user may write to. The checks are made on the directory as opened (its
//! `fstat`), and on Linux every name in it is then resolved through that open directory
//! (`/proc/self/fd/N/name`), so a directory renamed or replaced after the check is not the one
//! used; elsewhere names are resolved through its path again.
//!
//! **Creation.** Missing directories are made with mode 0700, and the last one is set to exactly
//! 0700 whatever the umask; Atlas then writes its marker in it ([`MARKER`]).
//!
//! **Reading.** An entry is opened without following a symbolic link and without waiting
//! (`O_NOFOLLOW | O_NONBLOCK`: a FIFO at its name does not block), must be a regular file (the
//! `fstat` of what was opened), at most [`MAX_ENTRY_BYTES`] long, and no more than its size is
//! read.
//!
//! **Writing.** A temporary file of the process's own, created exclusively (never through a
//! link) with mode 0600 (0644 in a shared cache, for the others who use it) set explicitly, not
//! left to the umask, then renamed over the entry's name.
//!
//! **Eviction.** Only names Atlas writes (`<32 hex digits>.atlas`, `<32 hex digits>.<pid>.<n>.tmp`),
//! only regular files, and only in a directory that holds Atlas's marker: written when Atlas makes
//! the directory, or when it finds one that holds nothing but Atlas's files. Nothing else in a
//! directory is ever removed; in a directory that holds other files, the entries are not bounded.
//!
//! [`CompileCache::shared`]: crate::CompileCache::shared

#![cfg_attr(not(unix), allow(dead_code))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The longest entry read or written: 1 GiB. What NVRTC makes of one program is far smaller (the
/// cubin of a 1,000-kernel source is a few megabytes); the cap bounds what a bad entry costs.
pub(crate) const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// Atlas's marker in a directory it evicts from: a cache directory tag
/// (<https://bford.info/cachedir/>), which backup tools also read as "skip this".
const MARKER: &str = "CACHEDIR.TAG";
const MARKER_TEXT: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55\n\
# A cache of CUDA kernels compiled by Atlas (atlas-registry), which removes only its own\n\
# entries from it. About this file: https://bford.info/cachedir/\n";

const EXTENSION: &str = "atlas";
const TEMP_EXTENSION: &str = "tmp";
/// How old a temporary file must be before eviction takes it for an interrupted process's.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Why a cache directory is not used ([`CacheOutcome::Untrusted`]): someone other than this
/// process's user could have put code in it.
///
/// [`CacheOutcome::Untrusted`]: crate::CacheOutcome::Untrusted
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Distrust {
    /// Another user owns the directory (and so decides what is in it).
    #[error(
        "it belongs to user {owner} and this process runs as user {user} (use a directory of \
         your own, or CompileCache::shared for one shared with people you trust)"
    )]
    NotOwned {
        /// The directory's owner.
        owner: u32,
        /// This process's effective user.
        user: u32,
    },
    /// Its group or every user may write to it.
    #[error(
        "its mode {mode:04o} lets other users write to it (`chmod go-w` it, or use \
         CompileCache::shared for a directory shared with people you trust)"
    )]
    Writable {
        /// The directory's permission bits.
        mode: u32,
    },
    /// Every user may write to it, which even a shared cache refuses.
    #[error("its mode {mode:04o} lets every user write to it, which even a shared cache refuses")]
    WritableByAll {
        /// The directory's permission bits.
        mode: u32,
    },
    /// File ownership is not checked on this platform, so no directory is trusted.
    #[error("the compile cache checks file ownership only on Unix, and is off here")]
    Unchecked,
}

/// Whether a directory of `owner` and `mode` may be used by `user`; why not.
fn distrust(owner: u32, mode: u32, user: u32, shared: bool) -> Option<Distrust> {
    let mode = mode & 0o7777;
    if mode & 0o002 != 0 {
        Some(if shared {
            Distrust::WritableByAll { mode }
        } else {
            Distrust::Writable { mode }
        })
    } else if shared {
        None
    } else if owner != user {
        Some(Distrust::NotOwned { owner, user })
    } else if mode & 0o020 != 0 {
        Some(Distrust::Writable { mode })
    } else {
        None
    }
}

/// Why a cache directory could not be opened or made.
pub(crate) enum Refusal {
    /// It does not exist.
    Missing,
    /// It is not to be used.
    Untrusted(Distrust),
    /// The error, as a sentence naming the directory.
    Failed(String),
}

/// The file name of the entry whose key is `hex`.
pub(crate) fn entry_name(hex: &str) -> String {
    format!("{hex}.{EXTENSION}")
}

/// A file name of this process's own for writing the entry whose key is `hex`.
pub(crate) fn temp_name(hex: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{hex}.{}.{n}.{TEMP_EXTENSION}", std::process::id())
}

/// What a file name in a cache directory is.
#[derive(Debug, PartialEq, Eq)]
enum Name {
    Entry,
    Temp,
    Marker,
    /// Not a name Atlas writes.
    Other,
}

fn name_kind(name: &str) -> Name {
    let is_key =
        |s: &str| s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let is_number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if name == MARKER {
        return Name::Marker;
    }
    if name
        .strip_suffix(EXTENSION)
        .and_then(|n| n.strip_suffix('.'))
        .is_some_and(is_key)
    {
        return Name::Entry;
    }
    let temp = name
        .strip_suffix(TEMP_EXTENSION)
        .and_then(|n| n.strip_suffix('.'))
        .map(|n| n.split('.').collect::<Vec<_>>());
    match temp.as_deref() {
        Some([key, pid, n]) if is_key(key) && is_number(pid) && is_number(n) => Name::Temp,
        _ => Name::Other,
    }
}

/// Removes the least recently used of `entries` (`(last use, length, name)`) until they and the
/// `kept` bytes of the entry just stored add up to at most `max_bytes`; `remove` removes one and
/// says whether it did. The sum is a `u128`: file sizes are whatever a file system reports (a
/// sparse file may claim exabytes), and no number of them below 2^64 overflows it.
fn evict_until(
    mut entries: Vec<(SystemTime, u64, String)>,
    kept: u64,
    max_bytes: u64,
    mut remove: impl FnMut(&str) -> bool,
) {
    let mut total = u128::from(kept) + entries.iter().map(|e| u128::from(e.1)).sum::<u128>();
    let max_bytes = u128::from(max_bytes);
    if total <= max_bytes {
        return;
    }
    entries.sort_unstable();
    for (_, len, name) in entries {
        if total <= max_bytes {
            break;
        }
        if remove(&name) {
            total -= u128::from(len);
        }
    }
}

#[cfg(unix)]
pub(crate) use unix::CacheDir;

#[cfg(unix)]
mod unix {
    use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
    use std::io::{self, Read, Write};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    use std::path::{Path, PathBuf};
    use std::time::SystemTime;

    use super::{
        MARKER, MARKER_TEXT, Name, Refusal, STALE_TEMP, distrust, evict_until, name_kind, temp_name,
    };

    /// A cache directory, open and checked.
    pub(crate) struct CacheDir {
        /// The directory as opened: what its checks were made on.
        handle: File,
        /// Where names in it are resolved (see the module docs).
        base: PathBuf,
        /// Its path, for messages.
        path: PathBuf,
        shared: bool,
    }

    impl CacheDir {
        /// The directory at `path`, when it may be used.
        pub(crate) fn open(path: &Path, shared: bool) -> Result<Self, Refusal> {
            let handle = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(path)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => Refusal::Missing,
                    _ => Refusal::Failed(format!("cannot open {}: {e}", path.display())),
                })?;
            let meta = handle
                .metadata()
                .map_err(|e| Refusal::Failed(format!("cannot stat {}: {e}", path.display())))?;
            if let Some(why) = distrust(meta.uid(), meta.mode(), user(), shared) {
                return Err(Refusal::Untrusted(why));
            }
            Ok(Self {
                base: base(&handle, path),
                handle,
                path: path.to_path_buf(),
                shared,
            })
        }

        /// The directory at `path`, made (with its parents) when missing, when it may be used.
        pub(crate) fn create(path: &Path, shared: bool) -> Result<Self, Refusal> {
            let failed =
                |e: io::Error| Refusal::Failed(format!("cannot create {}: {e}", path.display()));
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(failed)?;
            }
            let made = match DirBuilder::new().mode(0o700).create(path) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(failed(e)),
            };
            let dir = Self::open(path, shared).map_err(|refusal| match refusal {
                Refusal::Missing => Refusal::Failed(format!("{} vanished", path.display())),
                other => other,
            })?;
            if made {
                // mkdir's mode went through the umask: set it exactly, on the directory opened
                // (which the checks found to be this user's own).
                let _ = dir.handle.set_permissions(Permissions::from_mode(0o700));
                dir.write_marker();
            }
            Ok(dir)
        }

        /// `name` in the directory, for messages.
        pub(crate) fn shown(&self, name: &str) -> PathBuf {
            self.path.join(name)
        }

        /// The regular file `name` (opened, to set its time) and its bytes, at most `cap` of
        /// them; `None` when there is no file of that name; why it cannot be read.
        pub(crate) fn read(&self, name: &str, cap: u64) -> Result<Option<(File, Vec<u8>)>, String> {
            let file = match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(self.base.join(name))
            {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Err("a symbolic link, which the cache does not follow".into());
                }
                Err(e) => return Err(format!("cannot open it: {e}")),
            };
            let meta = file
                .metadata()
                .map_err(|e| format!("cannot stat it: {e}"))?;
            if !meta.is_file() {
                return Err(format!("not a regular file (a {})", kind(meta.file_type())));
            }
            if meta.len() > cap {
                return Err(format!(
                    "{} bytes, more than an entry may hold ({cap})",
                    meta.len()
                ));
            }
            // `len <= cap`, which fits in memory's address space on every target Atlas builds for.
            let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
            (&file)
                .take(meta.len())
                .read_to_end(&mut bytes)
                .map_err(|e| format!("cannot read it: {e}"))?;
            Ok(Some((file, bytes)))
        }

        /// Writes `bytes` as `name`: into the new file `temp`, renamed over `name`.
        pub(crate) fn publish(&self, name: &str, temp: &str, bytes: &[u8]) -> io::Result<()> {
            let mut file = self.create_file(temp)?;
            let temp = self.base.join(temp);
            let written = file
                .write_all(bytes)
                .and_then(|()| fs::rename(&temp, self.base.join(name)));
            if written.is_err() {
                let _ = fs::remove_file(&temp);
            }
            written
        }

        /// Creates the file `name`, which must not exist, with the cache's mode for files.
        fn create_file(&self, name: &str) -> io::Result<File> {
            let mode = if self.shared { 0o644 } else { 0o600 };
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW)
                .open(self.base.join(name))?;
            // The mode above went through the umask; this sets it exactly, on the file made.
            file.set_permissions(Permissions::from_mode(mode))?;
            Ok(file)
        }

        /// Writes Atlas's marker, whole or not at all, unless a file of its name is there: into a
        /// temporary file first, then linked to its name (a link, unlike a rename, replaces
        /// nothing).
        fn write_marker(&self) {
            let temp = temp_name(&"0".repeat(32));
            let Ok(mut file) = self.create_file(&temp) else {
                return;
            };
            let temp = self.base.join(temp);
            if file.write_all(MARKER_TEXT).is_ok() {
                let _ = fs::hard_link(&temp, self.base.join(MARKER));
            }
            let _ = fs::remove_file(&temp);
        }

        fn has_marker(&self) -> bool {
            matches!(
                self.read(MARKER, MARKER_TEXT.len() as u64),
                Ok(Some((_, text))) if text == MARKER_TEXT
            )
        }

        /// Removes the least recently used entries until they add up to at most `max_bytes`
        /// (never `keep`, the entry just stored), and temporary files older than an hour: only
        /// Atlas's files, in a directory that is Atlas's (see the module docs).
        pub(crate) fn evict(&self, max_bytes: u64, keep: &str) {
            let Ok(listing) = fs::read_dir(&self.base) else {
                return;
            };
            let now = SystemTime::now();
            let (mut entries, mut stale, mut kept) = (Vec::new(), Vec::new(), 0);
            let (mut marked, mut others) = (false, false);
            for item in listing.flatten() {
                let name = item.file_name();
                let Some(name) = name.to_str() else {
                    others = true;
                    continue;
                };
                // Not followed: a link is not a regular file.
                let regular = item.file_type().is_ok_and(|t| t.is_file());
                let modified = || {
                    item.metadata()
                        .and_then(|m| Ok((m.modified()?, m.len())))
                        .ok()
                };
                match name_kind(name) {
                    Name::Marker if regular && self.has_marker() => marked = true,
                    Name::Entry if regular => match modified() {
                        Some((_, len)) if name == keep => kept = len,
                        Some((time, len)) => entries.push((time, len, name.to_owned())),
                        None => {}
                    },
                    Name::Temp if regular => {
                        let age = modified().and_then(|(time, _)| now.duration_since(time).ok());
                        if age.is_some_and(|age| age > STALE_TEMP) {
                            stale.push(name.to_owned());
                        }
                    }
                    _ => others = true,
                }
            }
            if !marked {
                if others {
                    return;
                }
                self.write_marker();
            }
            for name in stale {
                let _ = fs::remove_file(self.base.join(name));
            }
            evict_until(entries, kept, max_bytes, |name| {
                fs::remove_file(self.base.join(name)).is_ok()
            });
        }
    }

    /// This process's effective user: whose files it makes.
    fn user() -> u32 {
        // SAFETY: `geteuid` takes no arguments, touches no memory of the caller's and cannot
        // fail (POSIX.1-2008).
        unsafe { libc::geteuid() }
    }

    /// Where names in the directory `handle` (opened at `path`) are resolved: on Linux the open
    /// directory itself, through `/proc/self/fd` (when this process's `/proc` shows it), else
    /// `path`.
    fn base(handle: &File, path: &Path) -> PathBuf {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            use std::sync::OnceLock;
            static BY_FD_WORKS: OnceLock<bool> = OnceLock::new();
            let by_fd = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
            let same =
                |a: &fs::Metadata, b: &fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
            let works = *BY_FD_WORKS.get_or_init(|| {
                matches!((handle.metadata(), fs::metadata(&by_fd)), (Ok(a), Ok(b)) if same(&a, &b))
            });
            if works {
                return by_fd;
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = handle;
        path.to_path_buf()
    }

    /// What a file that is not a regular file is, in words.
    fn kind(kind: fs::FileType) -> &'static str {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_dir() {
            "directory"
        } else if kind.is_fifo() {
            "FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else if kind.is_socket() {
            "socket"
        } else {
            "special file"
        }
    }
}

/// A cache directory: on this platform, never one (see [`Distrust::Unchecked`]).
#[cfg(not(unix))]
pub(crate) struct CacheDir {
    never: std::convert::Infallible,
}

#[cfg(not(unix))]
impl CacheDir {
    pub(crate) fn open(_: &std::path::Path, _: bool) -> Result<Self, Refusal> {
        Err(Refusal::Untrusted(Distrust::Unchecked))
    }

    pub(crate) fn create(path: &std::path::Path, shared: bool) -> Result<Self, Refusal> {
        Self::open(path, shared)
    }

    pub(crate) fn shown(&self, _: &str) -> std::path::PathBuf {
        match self.never {}
    }

    pub(crate) fn read(&self, _: &str, _: u64) -> Result<Option<(std::fs::File, Vec<u8>)>, String> {
        match self.never {}
    }

    pub(crate) fn publish(&self, _: &str, _: &str, _: &[u8]) -> std::io::Result<()> {
        match self.never {}
    }

    pub(crate) fn evict(&self, _: u64, _: &str) {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_users_own_directory_that_no_one_else_may_write_is_trusted() {
        let me = 1000;
        assert_eq!(distrust(me, 0o40700, me, false), None);
        assert_eq!(distrust(me, 0o755, me, false), None);
        assert_eq!(
            distrust(0, 0o700, me, false),
            Some(Distrust::NotOwned { owner: 0, user: me })
        );
        for mode in [0o770, 0o730, 0o2770] {
            assert_eq!(
                distrust(me, mode, me, false),
                Some(Distrust::Writable { mode })
            );
        }
        assert_eq!(
            distrust(me, 0o1777, me, false),
            Some(Distrust::Writable { mode: 0o1777 })
        );
        // Shared: any owner, group writers; never everybody.
        assert_eq!(distrust(0, 0o2775, me, true), None);
        assert_eq!(
            distrust(me, 0o1777, me, true),
            Some(Distrust::WritableByAll { mode: 0o1777 })
        );
    }

    #[test]
    fn only_the_names_atlas_writes_are_its_own() {
        let key = "0123456789abcdef0123456789abcdef";
        assert_eq!(name_kind(&entry_name(key)), Name::Entry);
        assert_eq!(name_kind(&temp_name(key)), Name::Temp);
        assert_eq!(name_kind("CACHEDIR.TAG"), Name::Marker);
        for other in [
            "notes.atlas",
            "0123456789ABCDEF0123456789ABCDEF.atlas",
            "0123456789abcdef0123456789abcdef0.atlas",
            "0123456789abcdef0123456789abcdef.atlas.tmp",
            "0123456789abcdef0123456789abcdef.1.tmp",
            "0123456789abcdef0123456789abcdef.1.x.tmp",
            "0123456789abcdef0123456789abcdef..1.tmp",
            "scratch.tmp",
            ".atlas",
        ] {
            assert_eq!(name_kind(other), Name::Other, "{other}");
        }
    }

    #[test]
    fn evictions_sum_does_not_overflow_on_any_sizes() {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let entries = vec![
            (at(3), u64::MAX, "c".to_string()),
            (at(1), u64::MAX, "a".to_string()),
            (at(2), u64::MAX, "b".to_string()),
            (at(4), 10, "d".to_string()),
        ];
        let mut removed = Vec::new();
        evict_until(entries.clone(), u64::MAX - 10, u64::MAX, |name| {
            removed.push(name.to_string());
            true
        });
        assert_eq!(
            removed,
            ["a", "b", "c"],
            "least recently used first, until it fits"
        );
        // A removal that fails counts nothing, and the next is tried: with `a` left, the others
        // are not enough.
        let mut tried = Vec::new();
        evict_until(entries, 0, 10, |name| {
            tried.push(name.to_string());
            name != "a"
        });
        assert_eq!(tried, ["a", "b", "c", "d"]);
    }
}
