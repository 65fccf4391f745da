//! Device memory: typed buffers ([`buffer`]), host↔device copies to any device address on any
//! stream ([`copy`]), and `__device__` variables ([`symbol`]).

pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod symbol;
