//! Device memory: typed buffers ([`buffer`]), allocated at once or in stream order, host↔device
//! copies to any device address on any stream ([`copy`]), `__device__` variables ([`symbol`]), and
//! the device's default memory pool that stream-ordered allocations come from ([`pool`]).

pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod pool;
pub(crate) mod symbol;
