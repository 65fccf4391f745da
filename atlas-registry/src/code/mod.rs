//! Kernel code: what a blob is and checking its structure before the driver sees it ([`blob`]),
//! which code a device can run ([`target`]), which PTX a driver JIT-compiles ([`isa`]), whether a
//! device runs a blob under its driver and what of it ([`fit`]), modules given as blobs for
//! several architectures ([`blob_set`]), the kernels' parameter layouts as blobs declare them
//! ([`layout`]) and whether they wait for the grid they depend on ([`dependency_wait`]), the
//! blobs this process has checked with theirs ([`check_cache`]), modules
//! loaded in one context ([`module`]), context-independent library loads
//! ([`library`]), and the JIT error log that a failed load carries ([`jit`]).

pub(crate) mod blob;
pub(crate) mod blob_set;
pub(crate) mod check_cache;
pub(crate) mod dependency_wait;
pub(crate) mod fit;
pub(crate) mod isa;
pub(crate) mod jit;
pub(crate) mod layout;
pub(crate) mod library;
pub(crate) mod module;
pub(crate) mod ptx_lexer;
pub(crate) mod target;
