//! Device memory: typed buffers ([`buffer`]), allocated at once or in stream order, host↔device
//! copies to any device address on any stream ([`copy`]), `__device__` variables ([`symbol`]), the
//! device's default memory pool that stream-ordered allocations come from ([`pool`]), and
//! page-locked host memory, allocated ([`pinned`]) or registered in place ([`registered`]), whose
//! asynchronous copies are safe ([`locked`]).

pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod locked;
pub(crate) mod pinned;
pub(crate) mod pool;
pub(crate) mod registered;
pub(crate) mod symbol;
