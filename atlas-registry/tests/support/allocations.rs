//! A global allocator that counts the calling thread's heap allocations, for tests that a path
//! allocates nothing. A test binary installs it with
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;` and reads [`allocations`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting each thread's allocations.
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the count is a thread-local
// `Cell` with a const initializer, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// How many allocations the calling thread has made (0 unless [`Counting`] is the binary's
/// global allocator).
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}
