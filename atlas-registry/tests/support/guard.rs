//! Blobs placed between guard pages, so that a reader that strays outside one faults at once.
//!
//! [`Guarded::new`] maps a megabyte of `PROT_NONE` memory on each side of the pages that hold a
//! copy of the blob, and puts the copy against one side: its last byte just before the guard
//! after it ([`Place::End`]), or its first byte just after the guard before it
//! ([`Place::Start`]). A read past the end, or before the start, of a blob so placed touches a
//! guard page and raises `SIGSEGV`, even where it would read harmless bytes of a heap and go
//! unnoticed. [`catch_guard_faults`] turns such a fault into an exit with
//! [`EXIT_PAST_END`] or [`EXIT_BEFORE_START`], which the parent tells from a crash elsewhere
//! (`killed by signal 11`).
//!
//! The C library's calls and layouts (`mmap`, `sigaction`, `siginfo_t`) are the `libc` crate's,
//! which has each architecture's own (x86-64 and AArch64 among them).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{
    _SC_PAGESIZE, MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_NONE, PROT_READ, PROT_WRITE,
    SA_RESETHAND, SA_SIGINFO, SIGBUS, SIGSEGV, siginfo_t,
};

/// The exit status of a child whose reader faulted in the guard after the blob's end.
pub const EXIT_PAST_END: i32 = 86;
/// The exit status of a child whose reader faulted in the guard before the blob's start.
pub const EXIT_BEFORE_START: i32 = 87;
/// The size of each guard.
const GUARD: usize = 1 << 20;

/// Where a blob lies among its guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Its last byte just before the guard after it.
    End,
    /// Its first byte just after the guard before it.
    Start,
}

impl Place {
    pub const ALL: [Place; 2] = [Place::End, Place::Start];

    /// `end`, `start`: the word in task lines and verdict files.
    pub fn word(self) -> &'static str {
        match self {
            Place::End => "end",
            Place::Start => "start",
        }
    }

    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.word() == word)
    }
}

/// The guard before and the guard after the blob placed last: `[start, end)` each.
static BEFORE: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static AFTER: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// A copy of a blob between guard pages; unmapped when dropped.
pub struct Guarded {
    map: *mut u8,
    map_len: usize,
    blob: *const u8,
    len: usize,
}

impl Guarded {
    /// Copies `blob` between guards, at `place`; makes these guards the ones whose faults
    /// [`catch_guard_faults`] reports.
    pub fn new(blob: &[u8], place: Place) -> Self {
        // SAFETY: no arguments; `_SC_PAGESIZE` is a valid name.
        let page = usize::try_from(unsafe { libc::sysconf(_SC_PAGESIZE) }).expect("a page size");
        let data = blob.len().div_ceil(page).max(1) * page;
        let map_len = GUARD + data + GUARD;
        // SAFETY: a fresh private anonymous mapping; no file, no fixed address.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(map != MAP_FAILED, "mmap of {map_len} bytes failed");
        let map = map.cast::<u8>();
        // SAFETY: `GUARD` is a multiple of the page size, and `GUARD + data` lies inside the
        // mapping made above.
        let data_start = unsafe { map.add(GUARD) };
        // SAFETY: the `data` bytes at `data_start` are pages of the mapping above.
        let status = unsafe { libc::mprotect(data_start.cast(), data, PROT_READ | PROT_WRITE) };
        assert_eq!(status, 0, "mprotect of the blob's pages failed");
        let offset = match place {
            Place::End => data - blob.len(),
            Place::Start => 0,
        };
        // SAFETY: `offset + blob.len() <= data`: inside the readable, writable pages, which
        // belong to no other object.
        let at = unsafe { data_start.add(offset) };
        // SAFETY: `blob` is readable for its length, `at` writable for as many bytes (above),
        // and the two do not overlap (a fresh mapping).
        unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), at, blob.len()) };
        let (map_addr, data_addr) = (map as usize, data_start as usize);
        BEFORE[0].store(map_addr, Ordering::SeqCst);
        BEFORE[1].store(data_addr, Ordering::SeqCst);
        AFTER[0].store(data_addr + data, Ordering::SeqCst);
        AFTER[1].store(data_addr + data + GUARD, Ordering::SeqCst);
        Self {
            map,
            map_len,
            blob: at,
            len: blob.len(),
        }
    }

    /// The copy of the blob.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `blob` were written in `new` and stay mapped, readable and
        // unchanged while `self` lives; a zero-length slice needs only a non-null, aligned
        // pointer, which `blob` is.
        unsafe { std::slice::from_raw_parts(self.blob, self.len) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; nothing borrows it past `self`.
        unsafe {
            libc::munmap(self.map.cast(), self.map_len);
        }
    }
}

/// Reports the fault of a reader in a guard of the blob placed last by exiting with
/// [`EXIT_PAST_END`] or [`EXIT_BEFORE_START`]; any other `SIGSEGV` or `SIGBUS` is left to kill
/// the process as it would have. Call before the loads whose faults it is to report (again
/// after anything that may set handlers of its own).
pub fn catch_guard_faults() {
    // SAFETY: `struct sigaction` is integers, a signal set and an optional function pointer, for
    // all of which zero bytes are a valid value (no handler, an empty set, no flags).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_fault as *const () as libc::sighandler_t;
    // The handler runs once: afterwards the default action (death by the signal) is back, so a
    // fault it does not report kills the process when the access is retried.
    action.sa_flags = SA_SIGINFO | SA_RESETHAND;
    for signal in [SIGSEGV, SIGBUS] {
        // SAFETY: `action` is a valid `struct sigaction` whose handler is an `extern "C"`
        // function of the `SA_SIGINFO` signature that calls only async-signal-safe `_exit`.
        let status = unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
        assert_eq!(status, 0, "sigaction({signal}) failed");
    }
}

extern "C" fn on_fault(_signal: i32, info: *mut siginfo_t, _context: *mut c_void) {
    // SAFETY: the kernel hands an `SA_SIGINFO` handler a valid `siginfo_t`, whose address field
    // is set for `SIGSEGV` and `SIGBUS`.
    let addr = unsafe { (*info).si_addr() } as usize;
    let inside = |guard: &[AtomicUsize; 2]| {
        guard[0].load(Ordering::SeqCst) <= addr && addr < guard[1].load(Ordering::SeqCst)
    };
    if inside(&AFTER) {
        // SAFETY: `_exit` is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(EXIT_PAST_END) }
    }
    if inside(&BEFORE) {
        // SAFETY: as above.
        unsafe { libc::_exit(EXIT_BEFORE_START) }
    }
}
