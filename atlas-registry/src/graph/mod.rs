//! CUDA graphs: capture a sequence of launches on a stream ([`capture`]: `begin_capture`, the
//! [`Capture`](capture::Capture) it returns, [`CudaGraph`](capture::CudaGraph)), instantiate it once, replay it, and change
//! kernel arguments of the instantiated graph without instantiating it again ([`exec`]); update a
//! whole instantiated graph from a new capture and upload it ahead of its first replay
//! ([`update`]); loops and branches decided on the device ([`conditional`]).
//!
//! Resolve every function before capture begins (take it from the registry or a
//! [`FunctionCache`](crate::FunctionCache) once): with lazy module loading, a first lookup loads
//! code, which must not happen inside a capture.

pub(crate) mod capture;
pub(crate) mod conditional;
pub(crate) mod exec;
pub(crate) mod features;
pub(crate) mod update;
