//! Device memory: typed buffers ([`buffer`]), allocated at once or in stream order; views of part
//! of a buffer ([`view`]); [`device_memory`], the sealed traits through which buffers and views are
//! copied and filled; copies host↔device to any device address on any stream and between device
//! memory ([`copy`]), 2D copies of pitched layouts ([`pitched`]), fills ([`fill`]), peer access and
//! copies between devices ([`peer`]); `__device__` variables ([`symbol`]); memory pools, the
//! device's default one and pools of one's own, that stream-ordered allocations come from
//! ([`pool`]); device memory shared between processes ([`sharing`]); and page-locked host memory,
//! allocated ([`pinned`]) or registered in place ([`registered`]), whose asynchronous copies are
//! safe ([`locked`]); many copies enqueued as one driver call ([`batch`]); virtual memory,
//! reserved, mapped and shared between processes, and buffers that grow in place
//! ([`virtual_memory`]).

pub(crate) mod batch;
pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod device_memory;
pub(crate) mod fill;
pub(crate) mod locked;
pub(crate) mod peer;
pub(crate) mod pinned;
pub(crate) mod pitched;
pub(crate) mod pool;
pub(crate) mod registered;
#[cfg(unix)]
pub(crate) mod sharing;
pub(crate) mod symbol;
pub(crate) mod view;
pub(crate) mod virtual_memory;
