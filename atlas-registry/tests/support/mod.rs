//! What the integration tests share. Every test file declares `mod support;` and uses the parts
//! it needs (hence the `allow`s: each test crate uses a subset).
//!
//! - [`rng`]: the one seeded random generator (fresh data for GPU tests, replayable fuzzer seeds).
//! - [`reference`]: CPU references of the kernels and checks of their output against them.
//! - [`blobs`]: loading the committed blobs, and blobs made to be refused.
//! - [`child`]: running a test body in a child process (this test binary, re-executed).
//! - [`standin`]: the stand-in libcuda (`standin.c`) that CI tests run against without a GPU.
//! - [`shim`]: a libcuda in front of the real one that hides entry points (GPU tests).
//! - [`mutate`]: seeded mutants of the committed blobs, for the blob fuzzer.
//! - [`nvrtc`]: the NVRTC the compile tests use, and children that compile with it.

#![allow(dead_code, unreachable_pub, unused_imports, unused_macros)]

pub mod blobs;
pub mod child;
pub mod mutate;
pub mod nvrtc;
pub mod reference;
pub mod rng;
pub mod shim;
pub mod standin;
