//! What the integration tests share. Every test file declares `mod support;` and uses the parts
//! it needs (hence the `allow`s: each test crate uses a subset).
//!
//! - [`allocations`]: a global allocator that counts each thread's allocations.
//! - [`rng`]: the one seeded random generator (fresh data for GPU tests, replayable fuzzer seeds).
//! - [`reference`]: CPU references of the kernels and checks of their output against them.
//! - [`blobs`]: loading the committed blobs, and blobs made to be refused.
//! - [`child`]: running a test body in a child process (this test binary, re-executed).
//! - [`scratch`]: where tests put the files they make (under `target/`), and directories removed
//!   when dropped.
//! - [`cc`]: shared libraries built from C at test time, with the target's C compiler.
//! - [`graphs`]: a graph's node types, the counted loop of the `conditional` model, the check of a
//!   `WrongContext` refusal.
//! - [`standin`]: the stand-in libcuda (`standin.c`) that CI tests run against without a GPU.
//! - [`shim`]: a libcuda in front of the real one that hides entry points (GPU tests).
//! - [`cubin`]: cubins taken apart for changes made on purpose, and laid out again.
//! - [`guard`]: blobs placed between guard pages, and the faults of readers that stray into them.
//! - [`mutate`]: seeded mutants of the committed blobs, for the blob fuzzer.
//! - [`fatbin`]: fatbins taken apart and put together again, compressed entries included.
//! - [`fixtures`]: the committed real fatbins under `tests/fixtures/`.
//! - [`corpus`]: blobs on disk (fatbin sections of ELF files, blob files), and Atlas's verdict.
//! - [`pool`]: many crash-prone tasks in a pool of child processes that outlives the crashes.
//! - [`raw`]: the driver without Atlas (plain loads, the driver's view of kernels).
//! - [`nvrtc`]: the NVRTC the compile tests use, and children that compile with it.
//! - [`nvrtc_library`]: which NVRTC that is (shared with the benches).
//! - [`spin`]: a kernel that keeps the device busy for a number of clock cycles.
//! - [`logger`]: a logger that keeps the records Atlas reports through the `log` facade.

#![allow(dead_code, unreachable_pub, unused_imports, unused_macros)]

pub mod allocations;
pub mod blobs;
pub mod cc;
pub mod child;
pub mod corpus;
pub mod cubin;
pub mod fatbin;
pub mod fixtures;
pub mod graphs;
pub mod guard;
pub mod logger;
pub mod mutate;
pub mod nvrtc;
pub mod nvrtc_library;
pub mod pool;
pub mod raw;
pub mod reference;
pub mod rng;
pub mod scratch;
pub mod shim;
pub mod spin;
pub mod standin;
