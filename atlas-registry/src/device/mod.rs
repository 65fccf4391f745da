//! The devices as the process uses them: one [`host`](host::host) per device (its primary
//! context, one stream, its limits), binding Atlas's context on the calling thread, and streams.

pub(crate) mod context;
pub(crate) mod host;
pub(crate) mod limits;
pub(crate) mod stream;
